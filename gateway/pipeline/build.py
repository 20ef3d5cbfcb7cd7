"""The answer path of one adapter, built from what it declares.

    ready notice → [human gate] → message limits → parts → adopt memory → commands → tool confirmations →
    engine failures ⟨ knowledge
    grounding → engine ready → prompt planning → token budget ⟨ generate ⟩⟩

A platform with human agents (`adapter.sessions`) gets the gate; the others do not. A new limit is a stage
module and one line here.
"""

from __future__ import annotations

from bots.channels import Channel
from gateway.pipeline.commands import AdoptMemory, Commands
from gateway.pipeline.gate import HumanGate
from gateway.pipeline.generate import EngineFailures, EngineReady, Generate
from gateway.pipeline.grounding import KnowledgeGrounding
from gateway.pipeline.job import Services
from gateway.pipeline.limits import MessageLimits, TokenBudget
from gateway.pipeline.notice import ReadyNotice
from gateway.pipeline.parts import ReadParts
from gateway.pipeline.prompt_plan import PromptPlanning
from gateway.pipeline.stage import Next, Stage, chain
from gateway.pipeline.tool_use import ToolConfirmations


def answer_stages(adapter: Channel, services: Services) -> list[Stage]:
    gate: list[Stage] = [HumanGate(services, adapter.sessions)] if adapter.sessions is not None else []
    return [
        ReadyNotice(services),
        *gate,
        MessageLimits(services),
        ReadParts(services),
        AdoptMemory(services),
        Commands(services),
        ToolConfirmations(services),
        EngineFailures(services),
        KnowledgeGrounding(services),
        EngineReady(services),
        PromptPlanning(services),
        TokenBudget(services),
        Generate(services),
    ]


def answer_pipeline(adapter: Channel, services: Services) -> Next:
    return chain(answer_stages(adapter, services))
