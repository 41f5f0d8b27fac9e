"""Entry points that only wire: the CLI and the demo."""
