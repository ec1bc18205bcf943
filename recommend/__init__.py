"""Two-stage recommendation: retrieval's candidates reranked (a layer above the families)."""
