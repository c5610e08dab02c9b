"""The scheduling process <-> decider worker wire format: msgpack arrays back to back on the worker's stdin/stdout.

Scheduling process -> worker, in the order the scheduling process's table changed (every message but ``DECIDE``
is one step of the replica's state; the worker counts them, and its answers carry the count):

- ``[INIT, options, seed, first_row, base, synced]``: once, first: how to build the replica's ``Simulator``
  (``config_path``: the ``KubeSchedulerConfiguration`` file, else ``config``: its parsed mapping, or None for the
  default profile;
  ``out_of_tree``: the installed plugins too), the tie-break seed, where the rotating node search starts, and the
  count the replica starts from (the state messages that follow at once are the whole state as of now, which
  it has applied once its count reaches ``synced``);
- ``[APPLY, kind, event, object]``: one watch event of a kind the simulator takes (nodes, bound or nominated pods,
  the plugins' watched objects);
- ``[ASSUME, pod, node, profile, at]``: the scheduling process assumed ``pod`` (its object) on ``node`` at wall
  clock ``at``; the replica assumes it and replays the Reserve of the plugins that account it (Dynamic's recent
  binding, stamped ``at``);
- ``[FORGET, uid, node, profile]``: that assumption was undone (a bind that failed or was withheld);
- ``[CONFIRM, uid, node, resource_version, condition]``: the pod watch showed that assumption bound, and the bound
  object differs from the assumed one only in what a bind changes (``podinfo.bound_version`` read it so): the
  replica rebuilds it from the object it assumed (``podinfo.bound_object``) instead of receiving it whole, as an
  ``APPLY`` would send it (packing the pod again was ~4 % of the scheduling process's instructions a pod);
- ``[DECIDE, id, profile, pod]``: decide ``pod`` (not a state step). The worker counts the pod on the node it
  answers at once (a provisional assumption: its next decisions see it), until the scheduling process's ``ASSUME``
  of that pod (which replaces it) or ``DONE``;
- ``[DONE, uid]``: to the worker that decided the pod, once the scheduling process acted on its answer: its
  provisional assumption, if still there, is dropped (not a state step: the scheduling process's table never
  had it).

Worker -> scheduling process: ``[id, node, seen]``: the node chosen ("" when none fits or the attempt failed) and
how many state messages the replica had applied when it decided; ``[READY_ID, seen, ""]`` once the replica
holds the whole state it was started with (no decision is sent to a worker before).
"""

from __future__ import annotations

INIT, APPLY, ASSUME, FORGET, DECIDE, DONE, CONFIRM = 0, 1, 2, 3, 4, 5, 6
READY_ID = 0
"""the answer id of a worker's readiness (decision ids start at 1)"""
