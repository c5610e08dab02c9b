"""``metadata.managedFields`` cut out of an API server's JSON before it is decoded.

kube-scheduler drops the managed fields of every pod it caches (``TrimManagedFields``), for memory; the scheduler
here does too, after decoding. Cut out of the bytes first, they are not decoded at all: a bound pod's watch event
(the one every bind brings back to the scheduling process) costs the informer 24-28 us of CPU instead of 46-50
(bench/scheduler/RESULTS.md, "What is left of the critical path").

Only where the bytes are laid out as the Kubernetes API server's encoder writes them: ``managedFields`` is the last
field of ``ObjectMeta`` (its Go struct's order), so the array ends where the metadata object does (``}]},"``
followed by the object's next field). An entry's own keys are ``manager``, ``operation``, ``apiVersion``, ``time``,
``fieldsType``, ``fieldsV1`` and ``subresource``, and ``fieldsV1`` is a tree of objects whose keys start with
``f:``, ``k:``, ``v:`` or ``i:``, or are ``.``: a cut that would take any other key with it (another encoder's
order) is not made, and that object is decoded whole. A quote inside a JSON string is escaped, so a pattern can
end inside a string only at its closing quote (a manager named ``}]},``): the cut then leaves text that is not JSON,
and ``loads`` decodes the whole bytes instead.
"""

from __future__ import annotations

import json
import re
from typing import Any

START = b',"managedFields":[{"manager":'
END = b'}]},"'
_OTHER_KEY = re.compile(rb'[,{]"(?!(?:manager|operation|apiVersion|time|fieldsType|fieldsV1|subresource)"|[fkvi]:|\.")')


def without_managed_fields(data: bytes) -> bytes:
    """``data`` (one object, a watch event, or a list of them) without the ``managedFields`` of each object laid
    out as the API server writes it; the others are left as they are."""
    parts: list[bytes] = []
    pos = search = 0
    while (start := data.find(START, search)) >= 0:
        end = data.find(END, start)
        if end < 0:
            break
        search = end + 2  # the metadata's closing brace and what follows it stay
        if _OTHER_KEY.search(data, start + len(START), end) is None:
            parts.append(data[pos:start])
            pos = search
        # else: not the encoder's layout, this object decodes whole
    if not parts:
        return data
    parts.append(data[pos:])
    return b"".join(parts)


def loads(data: bytes) -> Any:
    """``json.loads`` of ``data`` without its objects' managed fields (``without_managed_fields``); the whole bytes
    when the cut ones are not JSON."""
    cut = without_managed_fields(data)
    if cut is not data:
        try:
            return json.loads(cut)
        except ValueError:
            pass
    return json.loads(data)
