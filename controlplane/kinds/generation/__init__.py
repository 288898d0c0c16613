"""Text generation, ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses``: the three endpoint kinds
(kind.py) and everything they are made of, one concern a module.

- A line's body: fields.py (field rules, OpenAI's error codes), messages.py (chat messages → the conversation),
  schema.py (response_format → constrained decoding), tools.py (tools and tool_choice, the forced call's grammar,
  call ids), prompt.py (the conversation and tools through the chat template), tool_format.py (tools in the model's
  text: the Hermes format into the prompt, the parser out of the answer), bodies.py (a body → GenerationRequest or
  BodyError),
  responses.py and responses_input.py (a Responses body, its input items and tools, translated into the chat
  request they mean);
  tokenizer.py reads a model's tokenizer and chat template from its files.
- Cost: units.py (a line's tokens for the quota, the KV reservation and fair share).
- Running: columns.py (the parsed lines validation keeps per shard), engine.py (a line ↔ the engine's wire),
  run.py (a shard's lines on one generation stream), render.py (engine results → OpenAI's objects),
  responses_render.py (a chat completion → the Responses API's response object).

Who may import it: the rest of kinds/ (registry.py binds the kinds to their URLs). Other apps reach generation
through kinds.base and kinds.registry only (pyproject.toml, contract "Endpoint kinds' public surface").
bodies, fields, messages, prompt, tools, tool_format, render and units are pure (no database, no clock) and tested
on their own."""
