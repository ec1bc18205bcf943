"""SavedModel export for every family: the family gives its model, a function from the serving
inputs to click probabilities and the inputs' TensorSpecs; the SavedModel (signature
`serving_default`, output `probabilities`) is written into a staged directory renamed into
place, so a crash never leaves half an export."""
from __future__ import annotations

import tensorflow as tf

from core.dynamic import DynamicTable

from core.files import StagedDirectory


class ServingModel(tf.Module):
    def __init__(self, model, probabilities, signature: list, name: str):
        super().__init__(name=name)
        self.model = model  # tracked: its variables are saved with the signature
        self._probabilities = probabilities
        self.serve = tf.function(self._serve, input_signature=signature)

    def _serve(self, *inputs):
        return {"probabilities": self._probabilities(*inputs)}


def export_saved_model(model, probabilities, signature: list, output_path: str,
                       name: str = "serving") -> None:
    for module in model.submodules:
        if isinstance(module, DynamicTable):  # the id -> row map travels with the model
            module.freeze()
    serving = ServingModel(model, probabilities, signature, name)
    with StagedDirectory(output_path, overwrite=True) as staged:
        tf.saved_model.save(serving, staged.tmp_dir,
                            signatures={"serving_default": serving.serve})
