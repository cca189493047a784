"""The self-hosted vLLM engine side of Switchyard (profiles, launcher, planner).

The gateway talks to an engine only over HTTP (vLLM's OpenAI server and /metrics), never by
import. The engine tooling itself is built in its own issue; this package exists so the
distribution layout is fixed from the start.
"""
