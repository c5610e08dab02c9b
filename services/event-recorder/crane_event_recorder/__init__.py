"""crane-event-recorder: every pod binding reported by a ``Scheduled`` event, recorded once in Redis.

Replaces upstream's in-memory binding heap (1024 entries, lossy above ~3.4 pods/s, double-counts updated events,
forgets on restart). Read top-down: ``__main__`` -> ``app`` (clients, HTTP runtime) -> ``recorder`` (wiring) ->
``follower`` (list + watch, 410 handling) -> ``ingest`` / ``parse`` (event -> record, pure) -> ``buffer`` ->
``writer`` (Redis, outages) and ``trimmer`` (retention).

No leader election: every write is idempotent (a sorted-set member per pod UID, added only if absent, with its
notification in the same Lua script), so any number of replicas can record the same events, and trim, at once.
"""
