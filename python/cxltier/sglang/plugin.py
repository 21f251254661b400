"""SGLang plugin entry point (group sglang.srt.plugins, name cxltier).

SGLang calls install() at start-up in every process when plugins are
enabled (SGLANG_PLUGINS whitelists names). With CXLTIER_HISPARSE_HOST_POOL=1
it puts HiSparse's host KV pool in the tier (cxltier.sglang.hisparse); with
CXLTIER_ENGRAM_HOST_TABLE=1 SGLang's DeepSeek-V4.1 Engram host tables
live in the tier, one persistent copy per node (cxltier.sglang.engram_host); with
CXLTIER_ENGRAM set (a preset or a geometry file) it starts Engram prefetches
at the top of every forward pass (cxltier.sglang.engram_hook). Unless
CXLTIER_KV_EVENTS=0 it lets a HiCache backend with "kv_events" record the
tokens of the pages it backs up (cxltier.cluster.kvevents). Unless CXLTIER_DISAGG=0
it adds the "cxltier" disaggregation transfer backend
(--disaggregation-transfer-backend cxltier: cxltier.sglang.disagg). CXLTIER_PLUGIN=0
makes it do nothing. The HiCache backend needs no plugin: SGLang loads it
through the dynamic backend (cxltier.sglang.hicache).

A plugin must never stop SGLang from starting: each part is installed on its
own, and one that fails (an SGLang whose classes this package does not know,
say) is logged with the SGLang version and skipped, never raised.
"""

import logging
import os

logger = logging.getLogger(__name__)

# The SGLang releases the real-SGLang suite (python/tests_sglang) passes on.
TESTED_SGLANG = ("0.5.23",)


def sglang_version():
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return None


def _part(name, fn):
    """Runs one part's install; True when it installed something."""
    try:
        done = fn()
    except Exception as e:
        tested = ", ".join(TESTED_SGLANG)
        logger.error("cxltier plugin: %s not installed: SGLang %s is not one this cxltier knows (tested: %s): %s",
                     name, sglang_version() or "(version unknown)", tested, e)
        return False
    logger.info("cxltier plugin: %s %s", name, "installed" if done else "not installed (SGLang absent or done already)")
    return bool(done)


def _linker_token_records():
    try:
        from . import linker  # needs torch and SGLang
    except ImportError:
        return False
    return linker.install_token_records()


def _disagg():
    try:
        from . import disagg  # needs SGLang's disaggregation package
    except ImportError:
        return False
    return disagg.install()


def install():
    """Installs the parts the environment asks for. Returns the names of
    those installed."""
    if os.environ.get("CXLTIER_PLUGIN", "1") == "0":
        return []
    version = sglang_version()
    if version is None:
        logger.warning("cxltier plugin: SGLang is not installed in this Python; nothing to install")
        return []
    if version not in TESTED_SGLANG:
        logger.warning("cxltier plugin: SGLang %s has not been tested with this cxltier (tested: %s)",
                       version, ", ".join(TESTED_SGLANG))
    installed = []
    if os.environ.get("CXLTIER_KV_EVENTS", "1") != "0":
        from . import hicache

        if _part("token records of backed-up pages (KV events)", hicache.install_token_records):
            installed.append("kv-event-tokens")
        if _part("token records of linker offloads (KV events)", _linker_token_records):
            installed.append("kv-event-linker-tokens")
    if os.environ.get("CXLTIER_DISAGG", "1") != "0":
        if _part("the cxltier disaggregation transfer backend", _disagg):
            installed.append("disaggregation")
    if os.environ.get("CXLTIER_HISPARSE_HOST_POOL") == "1":
        from . import hisparse

        if _part("HiSparse host pool in the tier", hisparse.install):
            installed.append("hisparse")
    if os.environ.get("CXLTIER_ENGRAM_HOST_TABLE") == "1":
        from . import engram_host

        if _part("Engram host table in the tier", engram_host.install):
            installed.append("engram-host-table")
        from . import engram_staging

        if _part("Engram row stager reading the tier", engram_staging.install):
            installed.append("engram-stager")
    if os.environ.get("CXLTIER_ENGRAM"):
        from . import engram_hook

        if _part("Engram prefetch hook", engram_hook.install):
            installed.append("engram")
    return installed
