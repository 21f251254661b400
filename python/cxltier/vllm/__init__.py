"""cxltier's vLLM adapter: a KV connector that an unmodified vLLM loads by
this module's path:

    --kv-transfer-config '{"kv_connector": "CxlTierConnector",
                           "kv_connector_module_path": "cxltier.vllm", ...}'

Importing it imports vLLM and torch; the connector is in connector.py.
"""

from .connector import CxlTierConnector, CxlTierMetadata

__all__ = ["CxlTierConnector", "CxlTierMetadata"]
