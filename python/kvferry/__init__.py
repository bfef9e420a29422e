"""kvferry's Python side: the engine port client (``kvferry.port``), vLLM's connector
(``kvferry.vllm``), the reference engine (``kvferry.reference``) and the demo driver
(``kvferry.demo``). Pure Python; needs msgpack; numpy and torch are optional."""

__version__ = "0.1.0"
