"""Next-item retrieval (SASRec, HSTU): interaction sequences -> encoders -> full-ranking
metrics. retrieval.contract and retrieval.data describe and read the data that
retrieval.prepare_dataset writes."""
