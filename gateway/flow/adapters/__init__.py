"""Inbound protocol adapters: one per wire protocol, each feeding the one pipeline."""
