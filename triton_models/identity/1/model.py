"""Identity model: OUTPUT0 = INPUT0, one response per request."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pass

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            if tensor is None:
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("missing input INPUT0", pb_utils.TritonError.INVALID_ARG)
                    )
                )
                continue
            out = pb_utils.Tensor("OUTPUT0", tensor.as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self):
        pass
