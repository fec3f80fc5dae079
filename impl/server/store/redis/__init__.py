"""The shared store on a Redis (>= 7) or Valkey server: `store.RedisStore` and what it is built
from (`scripts`: the Lua scripts and their helpers, `pipeline`: one round trip per event-loop
iteration, `completions`: the session completion logs, `background`: leases, takeover and the
counters' refresh, `sessions`: client sessions shared by every process), and `embedded`, the
local redis-server that `hotpath serve --workers N` starts and stops itself.

Nothing is imported here: `impl.server.store.redis.store` needs redis-py (the `store` extra).
"""
