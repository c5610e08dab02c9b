"""Event-recorder benchmark: how fast bindings reach Redis, from a real watch and from a synthetic feed.

Run ``python -m bench.event_recorder --help``. Every phase uses one local cluster (real kube-apiserver, etcd,
redis-server) started for the run; ``redis-benchmark`` ZADD on the same Redis gives the yardstick.
"""
