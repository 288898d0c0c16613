"""Generation batches in the chaos suite: tinylm chat lines long enough to be mid-stream when a fault hits,
and the invariant beyond exactly-once that generation adds: every output body a valid chat.completion whose
counts agree with themselves, and the tokens on the batch and in the usage ledger equal to the sum over the
output lines, so a line regenerated after a fault is billed once.

Only the grammar is asserted (finish_reason, counts, exactly-once), never token counts or texts: tinylm's
tokenizer may change under these tests."""

from __future__ import annotations

from openai.types.chat import ChatCompletion

from tests.chaos.harness import GEN_MODEL, PROFILE, Chaos, Figures

CHAT = "/v1/chat/completions"
# Long enough that a shard's lines are still decoding when the fault hits: counts of 25 numbers (tinylm's
# longest trained span), most ending at EOS ("stop") under MAX_TOKENS, every fourth cut short ("length").
MAX_TOKENS = 40
SHORT_MAX_TOKENS = 12
SPAN = 24


def chat_lines(prefix: str, n: int | None = None) -> list[dict]:
    lines = []
    for i in range(n or PROFILE.gen_lines):
        start = i % 17  # numbers up to 40 are in tinylm's grammar
        body = {
            "model": GEN_MODEL,
            "messages": [{"role": "user", "content": f"count from {start} to {start + SPAN}"}],
            "max_tokens": SHORT_MAX_TOKENS if i % 4 == 3 else MAX_TOKENS,
            "temperature": 0,
        }
        lines.append({"custom_id": f"{prefix}-{i:05d}", "method": "POST", "url": CHAT, "body": body})
    return lines


def check_generation(chaos: Chaos, figures: Figures, batch_id: str, lines: list[dict], output: list[dict]) -> None:
    """Each output body a chat.completion with consistent counts; the batch's usage and the ledger's rows for
    the batch equal the sum over the output lines (one ledger row per shard: a regenerated shard is charged
    once). Adds the totals to the row's details."""
    prompt = completion = 0
    reasons: dict[str, int] = {}
    max_tokens = {line["custom_id"]: line["body"]["max_tokens"] for line in lines}
    for record in output:
        limit = max_tokens[record["custom_id"]]
        assert record["response"]["status_code"] == 200, record
        body = ChatCompletion.model_validate(record["response"]["body"])
        assert body.object == "chat.completion" and body.model == GEN_MODEL and len(body.choices) == 1
        choice, usage = body.choices[0], body.usage
        assert usage is not None and choice.finish_reason in ("stop", "length"), record
        assert 0 < usage.completion_tokens <= limit, record
        if choice.finish_reason == "length":
            assert usage.completion_tokens == limit, record
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, record
        assert usage.prompt_tokens > 0 and choice.message.role == "assistant", record
        prompt += usage.prompt_tokens
        completion += usage.completion_tokens
        reasons[choice.finish_reason] = reasons.get(choice.finish_reason, 0) + 1
    batch = chaos.clients[chaos.owners[batch_id]].batches.retrieve(batch_id)
    assert batch.usage is not None, batch_id
    totals = (batch.usage.input_tokens, batch.usage.output_tokens)
    assert totals == (prompt, completion), (batch_id, totals, prompt, completion)
    rows, shards, ledger_in, ledger_out = chaos.sql(
        "SELECT count(*), count(DISTINCT shard_id), coalesce(sum(tokens), 0)::bigint, "
        "coalesce(sum(output_tokens), 0)::bigint FROM usage_usagerecord WHERE batch_id=%s",
        batch_id,
    )[0]
    assert rows == shards, f"{batch_id}: {rows} ledger rows for {shards} shards (a shard charged twice)"
    assert (ledger_in, ledger_out) == (prompt, completion), (batch_id, ledger_in, ledger_out, prompt, completion)
    gen = figures.details.setdefault("generation", {"prompt_tokens": 0, "completion_tokens": 0, "finish": {}})
    gen["prompt_tokens"] += prompt
    gen["completion_tokens"] += completion
    for reason, count in reasons.items():
        gen["finish"][reason] = gen["finish"].get(reason, 0) + count


def shards_running(chaos: Chaos, batch_id: str) -> list[tuple[int, int]]:
    """(id, attempt) of the batch's shards running now."""
    return chaos.sql("SELECT id, attempt FROM batches_shard WHERE batch_id=%s AND status='running'", batch_id)


def pending_shards(chaos: Chaos, batch_id: str) -> int:
    return chaos.sql("SELECT count(*) FROM batches_shard WHERE batch_id=%s AND status='pending'", batch_id)[0][0]


def releases(chaos: Chaos, batch_id: str, since: float) -> int:
    """Shards of the batch given back (released or rescued) after `since`: the attempts a fault cut short."""
    return chaos.sql(
        "SELECT count(*) FROM batches_batchevent WHERE batch_id=%s AND created_at >= to_timestamp(%s) "
        "AND (kind LIKE 'shard_released_%%' OR kind LIKE 'shard_rescued_%%')",
        batch_id,
        since,
    )[0][0]


def first_claim_after(chaos: Chaos, batch_id: str, since: float) -> float | None:
    """Seconds from `since` to the batch's first shard claim after it (the resume figure less the shard's run)."""
    rows = chaos.sql(
        "SELECT extract(epoch FROM min(created_at))::float8 FROM batches_batchevent WHERE batch_id=%s "
        "AND kind='shard_claimed' AND created_at >= to_timestamp(%s)",
        batch_id,
        since,
    )
    return None if rows[0][0] is None else round(rows[0][0] - since, 2)
