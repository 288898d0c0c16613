"""sleep_per_row model: OUTPUT0 = INPUT0 after sleeping ``seconds_per_row`` (config.pbtxt) per row.

The sleep stands in for accelerator time: one instance serves at most 1 / seconds_per_row rows/s no matter
how many host cores there are, so adding servers (instances) adds capacity even on a 2-core machine."""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.seconds_per_row = float(config["parameters"]["seconds_per_row"]["string_value"])

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(request, "INPUT0") for request in requests]
        # One instance works through its rows one after another, as a busy GPU would: the whole call
        # (all requests the dynamic batcher merged) costs its total rows.
        rows = sum(tensor.as_numpy().shape[0] for tensor in inputs if tensor is not None)
        time.sleep(rows * self.seconds_per_row)
        responses = []
        for tensor in inputs:
            if tensor is None:
                error = pb_utils.TritonError("missing input INPUT0", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", tensor.as_numpy())]))
        return responses

    def finalize(self):
        pass
