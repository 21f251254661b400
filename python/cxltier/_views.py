"""Views of tier memory handed to Python (ctypes arrays over a mapping, and
the tensors made from them) and what must wait for them: unmapping the
tier, closing a read-only object view, freeing a region's chunks. Reading a
view after its mapping is gone faults the process, which no exception can
catch; reading one after its chunks went to another client reads that
client's data. So the release waits for the last view."""

import threading
import weakref


class Views:
    """Counts the live views of one mapping or span of chunks and runs the
    actions deferred to the moment the last one is collected."""

    def __init__(self):
        self._lock = threading.Lock()
        self._live = 0
        self._then = []

    def track(self, view, release=None):
        """Counts view as live until it is collected, and then calls release
        (when given) before anything deferred to the last view; returns it."""
        with self._lock:
            self._live += 1
        weakref.finalize(view, self._gone, release)
        return view

    def after(self, fn):
        """Runs fn now when no view is live (its errors reach the caller), or
        else when the last one goes (its errors then go nowhere: the
        resource is released on a best-effort basis, and the library frees
        it at detach or at the client's end in any case)."""
        with self._lock:
            if self._live:
                self._then.append(fn)
                return
        fn()

    def _gone(self, release=None):
        if release is not None:
            try:
                release()
            except Exception:
                pass
        with self._lock:
            self._live -= 1
            due, self._then = (self._then, []) if self._live == 0 else ([], self._then)
        for fn in due:
            try:
                fn()
            except Exception:
                pass
