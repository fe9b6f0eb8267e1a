"""``POST /v1/embeddings``: the body, its inputs as token ids, and the answer OpenAI's clients read."""
