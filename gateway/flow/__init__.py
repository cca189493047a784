"""The request flow: one typed exchange per request, the services bundle, the orchestrator."""
