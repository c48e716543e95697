"""moto's standalone S3 server with conditional writes made atomic, as they are on S3.

moto checks a ``PutObject``'s ``If-None-Match: *`` and then writes the object in two steps,
on a server that handles requests on threads: two requests to create the same key at the
same moment could both pass the check and both succeed, which S3 never lets happen. The
writer lease's race test failed this way once, on a loaded machine; with the server's
threads switching as often as Python allows (``sys.setswitchinterval(1e-6)``), 3 of 300
pairs of simultaneous conditional PUTs both succeeded on moto 5.2.5, none with this lock.
Here each ``PutObject`` runs under one lock. Run as ``python tests/moto_server.py -H HOST -p PORT``
(the arguments of ``python -m moto.server``).
"""

from __future__ import annotations

import functools
import threading

from moto.s3.responses import S3Response
from moto.server import main

_put_object = S3Response.put_object
_lock = threading.Lock()


@functools.wraps(_put_object)
def _atomic_put_object(self, *args, **kwargs):
    with _lock:
        return _put_object(self, *args, **kwargs)


S3Response.put_object = _atomic_put_object

if __name__ == "__main__":
    main()
