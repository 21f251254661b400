"""Module paths of cxltier 0.1 that moved in 0.2, when the package was split
into its core and one subpackage per engine and for the cluster.

Engines load adapters by a module path written in their configuration
(SGLang's module_path and linker_module_path, a Kubernetes manifest's
python -m ...). A path that moved fails with ModuleNotFoundError naming its
new path, instead of a bare "No module named".
"""

import importlib.abc

MOVED = {
    "cxltier.hicache": "cxltier.sglang.hicache",
    "cxltier.linker": "cxltier.sglang.linker",
    "cxltier.disagg": "cxltier.sglang.disagg",
    "cxltier.plugin": "cxltier.sglang.plugin",
    "cxltier.hisparse": "cxltier.sglang.hisparse",
    "cxltier.engram_hook": "cxltier.sglang.engram_hook",
    "cxltier.engram_host": "cxltier.sglang.engram_host",
    "cxltier.engram_staging": "cxltier.sglang.engram_staging",
    "cxltier.pagekeys": "cxltier.sglang.pagekeys",
    "cxltier.uplink": "cxltier.cluster.uplink",
    "cxltier.kvevents": "cxltier.cluster.kvevents",
    "cxltier.events_cli": "cxltier.cluster.events_cli",
}


class MovedFinder(importlib.abc.MetaPathFinder):
    """Refuses a moved path, naming where it went. It is consulted only for
    names no other finder resolved first (it sits at the end of
    sys.meta_path), so it never shadows a module that exists."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        raise ModuleNotFoundError(
            f"{fullname} moved to {new} in cxltier 0.2: use {new} (SGLang's module_path, "
            f"a manifest's python -m) instead", name=fullname)


def install(meta_path):
    if not any(isinstance(f, MovedFinder) for f in meta_path):
        meta_path.append(MovedFinder())
