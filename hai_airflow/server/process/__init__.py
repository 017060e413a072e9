"""What the parts of one `hai serve` process share: its context, wake-ups and metrics."""
