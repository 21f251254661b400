"""cxltier's SGLang adapters.

Each module imports SGLang (and torch) only when it is imported, and none is
imported by this package: SGLang loads each one by its path.

- hicache: the HiCache L3 storage backend (--hicache-storage-backend
  dynamic, module_path cxltier.sglang.hicache).
- linker: the unified-cache external linker (linker_module_path
  cxltier.sglang.linker).
- disagg: the prefill-to-decode transfer backend
  (--disaggregation-transfer-backend cxltier, added by the plugin).
- plugin: the sglang.srt.plugins entry point that installs the rest
  (hisparse, engram_host, engram_staging, engram_hook, token records).
- pagekeys: the page key scheme that hicache, linker and disagg share, so a
  page one of them stores is a hit for the others.
"""
