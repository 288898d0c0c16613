"""Which models run where: the placement loop (signal → plan → apply). ``planner`` is a pure function of plain
values (``types``), with ``consolidation``, ``payback`` and ``changes``, no Django in any of them; the
reconciler reads demand and measured memory, asks the planner and applies the plan, make-before-break;
``routing`` picks the server a call goes to from the ready placements; ``readiness`` waits until models are
served. Used by the fleet app only (its tasks, admin, backend, commands, and sizing's shared helpers)."""
