"""Integrations with the training frameworks users already run: each module is imported only
when its framework is installed, and the library itself never imports them."""
