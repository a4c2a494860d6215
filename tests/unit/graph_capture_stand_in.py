"""A stand-in for CUDA graph capture on CPU, shared by the generation tests."""

from __future__ import annotations


def count_captures(monkeypatch) -> list:
    """A stand-in for CUDA graph capture on CPU (its replay runs the step on the same buffers); returns the list
    of (rows, attended length) each capture appends to."""
    from forge_core.generation import decoder

    captured = []

    class StandInGraph:
        def __init__(self, dec, static_tokens, kv_len):
            self.dec, self.static_tokens, self.kv_len = dec, static_tokens, kv_len
            self.logits = None

        def replay(self):
            self.logits.copy_(self.dec.step(self.static_tokens, self.kv_len))

    def capture(self, tokens, kv_len):
        captured.append((tokens.shape[0], kv_len))
        graph = StandInGraph(self.decoder, tokens.clone(), kv_len)
        graph.logits = self.decoder.step(graph.static_tokens, kv_len).clone()
        return graph, graph.static_tokens, graph.logits

    monkeypatch.setattr(decoder.DecodeGraphs, "capture", capture)
    return captured
