"""vLLM's ``ExampleConnector`` with its loads reported asynchronous, for the
scheduler's async KV-load path: a request with an external hit waits
(``WAITING_FOR_REMOTE_KVS``) until a step's ``KVConnectorOutput`` reports its
load received, then its blocks are cached (``cache_blocks``). The scheduler
side only: no worker reads the metadata."""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)


class AsyncLoadConnector(ExampleConnector):
    """``ExampleConnector`` whose external hits load asynchronously."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        num, _ = super().get_num_new_matched_tokens(request, num_computed_tokens)
        return num, bool(num)

    def build_connector_meta(self, scheduler_output):
        # A loading request is not scheduled in the step its load starts,
        # which the example's metadata builder expects; no worker reads it.
        self._requests_need_load.clear()
        return ExampleConnectorMetadata()
