"""Performance accounting: FLOPs per phase, the machine's measured peak, MFU."""
