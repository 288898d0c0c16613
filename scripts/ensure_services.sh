#!/usr/bin/env bash
# Start Postgres, Redis and RabbitMQ if they are down (they normally run already on dev machines and CI).
set -u
port_open() { (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; }
wait_port() { for _ in $(seq 1 60); do port_open "$1" && return 0; sleep 1; done; echo "service on port $1 did not come up" >&2; return 1; }

if ! port_open 5432; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
  wait_port 5432 || exit 1
fi
# The suite runs a stack (web, three Celery workers with thread pools, beat: ~30 connections) beside the
# process-starting tests and three pytest workers; Debian's default of 100 connections runs out. Raise it once
# (ALTER SYSTEM persists it) and restart the cluster, only while nothing of the suite is running yet.
MIN_PG_CONNECTIONS=300
current=$(psql -h 127.0.0.1 -U postgres -tAc "SHOW max_connections" 2>/dev/null || echo 0)
if [ "${current:-0}" -lt "$MIN_PG_CONNECTIONS" ]; then
  echo "raising PostgreSQL max_connections from ${current} to ${MIN_PG_CONNECTIONS} (restarts the cluster)"
  psql -h 127.0.0.1 -U postgres -qc "ALTER SYSTEM SET max_connections = ${MIN_PG_CONNECTIONS}" \
    && pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main restart \
    && wait_port 5432 || echo "could not raise max_connections; continuing with ${current}" >&2
fi
if ! port_open 6379; then
  echo "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_port 6379 || exit 1
fi
if ! port_open 5672; then
  echo "starting RabbitMQ"
  rabbitmq-server -detached
  wait_port 5672 || echo "RabbitMQ did not start; the suite uses Redis as its broker, continuing" >&2
fi
exit 0
