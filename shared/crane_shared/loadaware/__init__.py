"""The load domain shared by the in-process Dynamic plugin and the extender: the Dynamic policy arithmetic
(``dynamic``) and the pod-sizing rule of the usage estimate (``podsize``).

Pure: no I/O, no Kubernetes/Redis/Prometheus client, no numpy; inputs are annotations, policy, time, recent
bindings and pod specs, so both deciders give the same answer for the same inputs.
"""
