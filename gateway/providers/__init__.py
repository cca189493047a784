"""Upstream APIs: one module per API, each implementing ``base.Provider``."""
