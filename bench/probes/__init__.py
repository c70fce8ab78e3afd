"""Probes of the machine and of shoal's own choices: the cores' distance, interference, A/B runs."""
