"""Triton python-backend model: text generation with continuous batching (cb_engine.py next to this file).

Decoupled, and speaking Triton's vLLM backend interface (same tensor names, same `sampling_parameters` JSON,
same optional `return_*` flags and outputs), so the control plane drives this CPU model and a vLLM model on
GPUs with one code path. Extras, optional and off by default: `return_num_cached_tokens` →
`num_cached_tokens` (prompt tokens served from the prefix cache, for usage's cached_tokens); `prompt_token_ids`,
the prompt already tokenized as the engine tokenizes text_input, taken instead of tokenizing the text again.

LoRA adapters (cb_lora.py): `lora_name` in `sampling_parameters` (where Triton's vLLM backend reads it) names
the adapter a request runs with; the engine loads the ones listed in the LORA_ADAPTERS parameter (empty: every one in ADAPTERS_DIR) at start, and
any other adapter of ADAPTERS_DIR the first time a request names it. A control request, `lora_control` (JSON
`{"action": "load" | "unload" | "list", "name": ..., "path": ...}`, no generation), loads or unloads one while
the base runs on; its one response's `text_output` is `{"adapters": [loaded names]}`.

`execute` only parses and queues: the engine's step loop runs in a background thread and answers each request
through its response sender (streamed deltas when `stream` is true, else one response), the last one flagged
final. A request the engine cannot take gets its own error response; its neighbours run on.
"""

import json
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

_FLAGS = (
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
    "return_num_cached_tokens",
)


def _parameter(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value else default


def _bool_input(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else bool(tensor.as_numpy().reshape(-1)[0])


def _string_input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _pop_lora_name(text):
    """(the LoRA adapter named by `lora_name`, the sampling parameters without it): vLLM's backend takes the
    adapter's name from the sampling parameters and hands the rest to SamplingParams."""
    if text in (None, b"", ""):
        return None, text
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None, text  # SamplingParams.from_json says what is wrong with it
    if not isinstance(raw, dict) or "lora_name" not in raw:
        return None, text
    name = raw.pop("lora_name")
    if name is not None and not isinstance(name, str):
        raise ValueError("sampling_parameters.lora_name must be a string")
    return name or None, json.dumps(raw)


def _error(message, code_name="INVALID_ARG"):
    code = getattr(pb_utils.TritonError, code_name, pb_utils.TritonError.INTERNAL)
    return pb_utils.TritonError(message, code)


class _Responder:
    """Sends the engine's responses from a thread of its own, in the order they were built. A response sender's
    `send` waits for the server to take the response (an IPC round trip through the stub's and tritonserver's
    threads); on the engine's thread that wait came between decode steps, once for every finished line. So the
    engine no longer waits for a client to take its responses: a request can finish before its client's cancel
    arrives, and the queue holds what tritonserver has not taken yet (freed as it does)."""

    def __init__(self, engine):
        self.engine = engine
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="responder", daemon=True)
        self._thread.start()

    def send(self, sender, request_id, response, flags=0):
        self._queue.put((sender, request_id, response, flags))

    def stop(self):
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self):
        while (item := self._queue.get()) is not None:
            sender, request_id, response, flags = item
            try:
                sender.send(response, flags=flags)
            except Exception as exc:  # noqa: BLE001 - the caller went away: its request stops, the others run on
                pb_utils.Logger.log_warn(f"response of {request_id} not sent ({exc}); cancelling it")
                self.engine.cancel(request_id)


class _Stream:
    """What has been sent to one Triton request so far (the deltas of the next streamed response)."""

    def __init__(self, model_name, sender, responder, engine, prompt, stream, prepend, flags):
        self.model_name, self.sender, self.responder, self.engine = model_name, sender, responder, engine
        self.prompt, self.stream, self.prepend, self.flags = prompt, stream, prepend, flags
        self.sent_chars, self.sent_tokens = {}, {}

    def on_update(self, request):
        """Builds the response on the engine's thread (it reads the request as this step left it) and hands it
        to the responder to send."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if request.error is not None:
            response, flags = pb_utils.InferenceResponse(error=_error(request.error, "INTERNAL")), final
        elif request.cancelled:
            generated = max(len(c.token_ids) for c in request.choices)
            pb_utils.Logger.log_info(f"{self.model_name} cancelled {request.request_id} after {generated} tokens")
            response, flags = pb_utils.InferenceResponse(error=_error("Request was cancelled", "CANCELLED")), final
        elif request.finished:
            response, flags = self._response(request), final
        elif self.stream:
            response, flags = self._response(request), 0
        else:
            return  # not streamed: one response when it finishes
        self.responder.send(self.sender, request.request_id, response, flags)

    def _response(self, request):
        texts, reasons, logprobs, counts = [], [], [], []
        for choice in request.choices:
            # Streamed: the text that can no longer change since the last response; else all of it.
            start = self.sent_chars.get(choice.index, 0) if self.stream else 0
            end = choice.stable_chars if self.stream else len(choice.text)
            text = choice.text[start:end]
            texts.append((self.prompt + text if self.prepend else text).encode("utf-8"))
            self.sent_chars[choice.index] = end
            first = self.sent_tokens.get(choice.index, 0) if self.stream else 0
            self.sent_tokens[choice.index] = len(choice.token_ids)
            counts.append(len(choice.token_ids) - first)
            reasons.append(str(choice.finish_reason).encode("utf-8"))  # "None" while running, as vLLM's str()
            if "return_logprobs" in self.flags:
                logprobs.append(self._logprobs_json(choice, first, request.params.logprobs))
        outputs = [pb_utils.Tensor("text_output", np.asarray(texts, dtype=np.object_))]
        if "return_finish_reason" in self.flags:
            outputs.append(pb_utils.Tensor("finish_reason", np.asarray(reasons, dtype=np.object_)))
        if "return_cumulative_logprob" in self.flags:
            cumulative = [c.cumulative_logprob for c in request.choices]
            outputs.append(pb_utils.Tensor("cumulative_logprob", np.asarray(cumulative, dtype=np.float32)))
        if "return_logprobs" in self.flags:
            outputs.append(pb_utils.Tensor("logprobs", np.asarray(logprobs, dtype=np.object_)))
        if "return_num_input_tokens" in self.flags:
            count = len(request.prompt_token_ids)
            outputs.append(pb_utils.Tensor("num_input_tokens", np.asarray([count], dtype=np.uint32)))
        if "return_num_output_tokens" in self.flags:
            outputs.append(pb_utils.Tensor("num_output_tokens", np.asarray(counts, dtype=np.uint32)))
        if "return_num_cached_tokens" in self.flags:
            cached = [request.num_cached_tokens]
            outputs.append(pb_utils.Tensor("num_cached_tokens", np.asarray(cached, dtype=np.uint32)))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def _logprobs_json(self, choice, first, asked):
        if asked is None:
            return b"null"  # vLLM's value when the request did not ask for logprobs
        entries = []
        for pick in choice.picks[first:]:
            entries.append(
                {
                    str(token_id): {
                        "logprob": logprob,
                        "rank": rank,
                        # The token's text, as vLLM's detokenizer gives it (" 5"), not the vocabulary entry ("Ġ5").
                        "decoded_token": self.engine.tokenizer.decode([token_id]),
                    }
                    for token_id, (logprob, rank) in pick.top.items()
                }
            )
        return json.dumps(entries).encode("utf-8")


class TritonPythonModel:
    def initialize(self, args):
        # The engine's modules sit next to this file; the stub's sys.path does not include this directory.
        # Imported here, not at module import: Triton first spawns a throwaway stub that imports this file only
        # to auto-complete the config, and loading torch there too would double the load time.
        here = str(Path(__file__).resolve().parent)
        if here not in sys.path:
            sys.path.insert(0, here)
        from cb_engine import Engine
        from cb_sampling import SamplingParams

        self._sampling_params = SamplingParams
        config = json.loads(args["model_config"])
        self._name = args["model_name"]
        hf_dir = _parameter(config, "HF_DIR", "hf")
        if not Path(hf_dir).is_absolute():
            # This model's own version folder, not this file's: another model (triton_models/smollm2) serves
            # its own weights through this file by a symbolic link to it.
            hf_dir = str(Path(args["model_repository"]) / args["model_version"] / hf_dir)
        device = "cpu"
        if args.get("model_instance_kind") == "GPU":
            device = f"cuda:{args.get('model_instance_device_id', 0)}"
        started = time.monotonic()
        adapters_dir = _parameter(config, "ADAPTERS_DIR", "adapters")
        if not Path(adapters_dir).is_absolute():
            adapters_dir = str(Path(args["model_repository"]) / args["model_version"] / adapters_dir)
        listed = _parameter(config, "LORA_ADAPTERS", "")
        self.engine = Engine(
            hf_dir,
            kv_budget_tokens=int(_parameter(config, "KV_BUDGET_TOKENS", "16384")),
            max_seqs=int(_parameter(config, "MAX_NUM_SEQS", "64")),
            block_size=int(_parameter(config, "BLOCK_SIZE", "16")),
            prefix_caching=_parameter(config, "ENABLE_PREFIX_CACHING", "true").lower() == "true",
            device=device,
            threads=int(_parameter(config, "INTRA_OP_THREADS", "1")),
            max_model_len=int(_parameter(config, "MAX_MODEL_LEN", "0")) or None,
            adapters_dir=adapters_dir,
            adapters=[name.strip() for name in listed.split(",") if name.strip()] if listed else None,
            max_loras=int(_parameter(config, "MAX_LORAS", "0")),
        )
        self.engine.start()
        self._responder = _Responder(self.engine)
        self._counter = 0
        pb_utils.Logger.log_info(
            f"{args['model_name']} instance {args['model_instance_name']} loaded {hf_dir} on {device} in "
            f"{time.monotonic() - started:.2f}s: KV budget {self.engine.kv_budget_tokens} tokens, "
            f"max {self.engine.max_seqs} sequences, context {self.engine.context_length}, "
            f"LoRA adapters {self.engine.lora.names() or 'none'}"
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._submit(request, sender)
            except Exception as exc:  # noqa: BLE001 - this request gets the error; the others run on
                sender.send(
                    pb_utils.InferenceResponse(error=_error(str(exc))),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        return None  # decoupled: every answer goes through the response senders

    def _submit(self, request, sender):
        control = _string_input(request, "lora_control")
        if control is not None:
            self._control(control, sender)
            return
        text = pb_utils.get_input_tensor_by_name(request, "text_input")
        if text is None:
            raise ValueError("missing input text_input")
        prompt = text.as_numpy().reshape(-1)[0]
        prompt = prompt.decode("utf-8") if isinstance(prompt, bytes) else str(prompt)
        ids = pb_utils.get_input_tensor_by_name(request, "prompt_token_ids")
        stream = _bool_input(request, "stream", False)
        # vLLM's rule: the prompt is prepended unless excluded; never when streaming.
        exclude = _bool_input(request, "exclude_input_in_output", stream)
        if stream and not exclude:
            raise ValueError("When streaming, `exclude_input_in_output` = False is not allowed.")
        raw = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
        adapter, text = _pop_lora_name(raw.as_numpy().reshape(-1)[0] if raw is not None else None)
        params = self._sampling_params.from_json(text)
        flags = {name for name in _FLAGS if _bool_input(request, name, False)}
        state = _Stream(self._name, sender, self._responder, self.engine, prompt, stream, not exclude, flags)
        self._counter += 1
        self.engine.submit(
            prompt if ids is None else ids.as_numpy().reshape(-1).tolist(),
            params,
            request_id=f"{request.request_id() or 'request'}-{self._counter}",
            on_update=state.on_update,
            is_cancelled=sender.is_cancelled,
            stream=stream,
            adapter=adapter,
        )

    def _control(self, raw, sender):
        """A LoRA control request: load, unload or list adapters; answered with the adapters now loaded."""
        command = json.loads(raw)
        action, name = command.get("action"), command.get("name")
        if action == "load":  # running requests keep the weights they started with
            self.engine.lora.load(str(name), command.get("path"))
        elif action == "unload":  # ValueError when it is not loaded; running requests finish with it
            self.engine.lora.unload(str(name))
        elif action != "list":
            raise ValueError(f"lora_control action must be load, unload or list, got {action!r}")
        loaded = self.engine.lora.names()
        pb_utils.Logger.log_info(f"{self._name} LoRA {action} {name or ''}: loaded {loaded}")
        body = json.dumps({"adapters": loaded}).encode("utf-8")
        response = pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("text_output", np.asarray([body], dtype=np.object_))]
        )
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        self.engine.stop()
        self._responder.stop()
