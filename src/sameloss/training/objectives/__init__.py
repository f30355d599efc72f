"""Training objectives: what a step trains on besides the plain masked-language-model loss."""
