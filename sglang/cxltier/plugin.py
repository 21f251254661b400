"""SGLang plugin entry point (group sglang.srt.plugins, name cxltier).

SGLang calls install() at start-up when plugins are enabled. It registers
the HiCache backend under the name "cxltier" with SGLang's storage backend
factory where the factory allows it (the dynamic backend works without it,
see cxltier.hicache), and with CXLTIER_HISPARSE_HOST_POOL=1 puts HiSparse's
host KV pool in the tier (cxltier.hisparse). With CXLTIER_ENGRAM set (a
preset or a geometry file) it starts Engram prefetches at the top of every
forward pass (cxltier.engram_hook). CXLTIER_PLUGIN=0 makes it do nothing.
"""

import logging
import os

logger = logging.getLogger(__name__)


def install():
    if os.environ.get("CXLTIER_PLUGIN", "1") == "0":
        return False
    if os.environ.get("CXLTIER_HISPARSE_HOST_POOL") == "1":
        from . import hisparse

        logger.info("cxltier plugin: HiSparse host pool in the tier (%d places)", hisparse.install())
    if os.environ.get("CXLTIER_ENGRAM"):
        from . import engram_hook

        logger.info("cxltier plugin: Engram prefetch hook %s", "installed" if engram_hook.install() else "not installed")
    try:
        from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    except ImportError:
        logger.info("cxltier plugin: SGLang's storage backend factory not found; use the dynamic backend")
        return False
    register = getattr(StorageBackendFactory, "register_backend", None)
    if register is None:
        return False
    try:
        register("cxltier", "cxltier.hicache", "CxlTierStorage")
    except ValueError:  # already registered
        pass
    logger.info("cxltier plugin: HiCache storage backend 'cxltier' registered")
    return True
