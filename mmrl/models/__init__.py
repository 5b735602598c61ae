"""Model loading, the tiny-model factory and the one multimodal encoding path."""
