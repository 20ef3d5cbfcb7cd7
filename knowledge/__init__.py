"""Knowledge bases: the company's documents, searched (dense + lexical) so that bots answer from them with sources.

`knowledge.retrieval.Retriever` is what the worker calls; `knowledge.service.Knowledge` is what the `botgw kb`
commands use. Nothing here knows Redis or the platforms.
"""
