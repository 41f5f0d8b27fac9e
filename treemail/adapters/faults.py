"""What a failed round trip to the server raises, named for the floors that must not import its client.

A part that answers a tool call catches ``StoreError`` to answer with its
``engine_shutdown`` code (a retry of the same call is safe), never knowing
which client library the adapters use.
"""

from redis.exceptions import RedisError

StoreError = RedisError
