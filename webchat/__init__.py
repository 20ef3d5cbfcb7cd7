"""The web chat page (Chainlit): a client of the gateway's /web API, started by `botgw web`."""
