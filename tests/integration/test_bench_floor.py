"""bench/floor.py keeps what it says it keeps: the records' floor is a floor only if every record is there."""

import json

import redis.asyncio as aioredis

from bench import floor


async def test_the_floor_keeps_each_record_of_a_send_once_and_answers_a_retried_call_with_the_first_answer(redis_url):
    r = aioredis.Redis.from_url(redis_url)
    [(sender, [recipient])] = floor.trees_of(1, 1)
    try:
        await floor.prefill(r, [(sender, recipient, "first")], first=0)
        await floor.prefill(r, [(sender, recipient, "second")], first=1)
        await floor.prefill(r, [(sender, recipient, "first again")], first=0)  # the same tool call, retried
        await floor.run_worker(redis_url, 3)

        messages = await r.xrange(floor.session_key(recipient, "events"))
        assert [entry_id for entry_id, _ in messages] == [b"1-0", b"2-0"]
        first, second = (json.loads(fields[b"data"]) for _, fields in messages)
        assert (first["from"], first["body"], first["mode"], first["hops"]) == (sender, "first", "steer", 1)
        assert second["body"] == "second"
        records = [json.loads(fields[b"data"]) for _, fields in await r.xrange(floor.session_key(sender, "events"))]
        assert records == [{"message_id": first["message_id"], "to": recipient},
                           {"message_id": second["message_id"], "to": recipient}]
        ids = [floor.binary(first["message_id"]), floor.binary(second["message_id"])]
        assert await r.hgetall(floor.session_key(sender, "state")) == {
            b"version": b"2", b"run-1 call-0": ids[0], b"run-1 call-1": ids[1]}
        assert await r.hgetall(floor.session_key(recipient, "state")) == {b"version": b"2", ids[0]: b"0", ids[1]: b"0"}
        # One feed entry per send, naming both sessions and their new positions.
        assert [fields for _, fields in await r.xrange(floor.FEED)] == [
            {floor.binary(recipient): str(n).encode(), floor.binary(sender): str(n).encode()} for n in (1, 2)]
        answers = [json.loads(a)["ok"]["message_id"] for a in reversed(await r.lrange(floor.REPLY, 0, -1))]
        assert answers == [first["message_id"], second["message_id"], first["message_id"]]
        assert await r.ttl(floor.REPLY) > 0
        assert (await r.xpending(floor.STREAM, floor.GROUP))["pending"] == 0

        kinds = await floor.kept_bytes_by_kind(r, {sender})
        assert set(kinds) == set(floor.KEPT) and all(size > 0 for size in kinds.values())
    finally:
        await r.aclose()
