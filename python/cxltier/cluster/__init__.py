"""cxltier's cluster side: what joins a node's tier to other nodes.

- uplink: one process per node (python -m cxltier.cluster.uplink, or the
  cxltier-uplink script) writes stored pages behind to Mooncake Store and
  fills a local miss from it.
- kvevents: the node's KV event stream (cxltier-uplink --events): which
  pages the tier holds, with their tokens, for routers.
- events_cli: cxltier-events, which prints a node's stream.

None of them needs SGLang or vLLM.
"""
