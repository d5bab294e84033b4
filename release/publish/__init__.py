"""Publishing what was verified and measured: the model cards, the release manifest and the push."""
