"""Quantizing a transformers model as its checkpoint loads: ``from_pretrained(..., quantization_config=
quantization_config("int8"))``.

transformers reads a checkpoint one tensor at a time into a model built on the meta device, and hands each tensor
a registered quantizer marks to that quantizer's operation first. vgen registers one (``quant_method="vgen"``):
every linear layer of the family's decoder (:meth:`vgen.models.hf.TransformersFamily.decoder`, the layers
:meth:`~vgen.models.hf.TransformersModel.quantize_weights` takes) is replaced by its int8 / int4 form
(:func:`vgen.kernels.quant.quantized_layer`) as soon as its weight and bias are in, so the float weights of one
layer at most are held beside the quantized ones. The result is the model, byte for byte, that loading in float
and then quantizing gives; the decoder's input table is quantized after the load, as before (``pipe.quantize``
finishes it), so it is read in float once.

A family that names no decoder (``decoder`` returns None) is loaded in float and quantized after, as before.
"""
from __future__ import annotations

import torch.nn as nn
from transformers.core_model_loading import ConversionOps
from transformers.quantizers import register_quantization_config, register_quantizer
from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from vgen.errors import VGenError
from vgen.kernels.quant import LINEARS, check_mode, fits, quantized_layer
from vgen.models.loading import page_out, trim_heap

METHOD = "vgen"


class VGenQuantConfig(QuantizationConfigMixin):
    """``mode`` ("int8" / "int4") and int4's ``group_size``: what :func:`vgen.kernels.quant.quantized_layer` takes."""

    def __init__(self, mode: str = "int8", group_size: int = 32, **kwargs):
        self.quant_method = METHOD
        self.mode = check_mode(mode, group_size)
        self.group_size = int(group_size)


class _Quantize(ConversionOps):
    """One tensor of a marked linear layer in; the layer replaced once its weight (and bias) are all in."""

    def __init__(self, quantizer: VGenQuantizer):
        self.quantizer = quantizer

    def convert(self, input_dict, model=None, full_layer_name=None, missing_keys=None, **kwargs):
        (value,) = input_dict.values()
        tensor = value[0] if isinstance(value, list) else value
        parent_name, _, pname = full_layer_name.rpartition(".")
        layer = model.get_submodule(parent_name)
        setattr(layer, pname, nn.Parameter(tensor, requires_grad=False))
        if missing_keys is not None:
            missing_keys.discard(full_layer_name)
        if layer.weight.is_meta or (layer.bias is not None and layer.bias.is_meta):
            return {}  # the other tensor of this layer is still to come
        cfg = self.quantizer.quantization_config
        new = quantized_layer(layer, cfg.mode, cfg.group_size)
        new._is_hf_initialized = True  # transformers' weight init leaves it alone
        model.set_submodule(parent_name, new)  # the float layer goes here
        for t in (layer.weight, layer.bias):  # read for the last time: the file's pages go, then the freed heap
            if t is not None:
                page_out(t)
        del layer, tensor, value, input_dict
        trim_heap()
        self.quantizer.done += 1
        return {}


class VGenQuantizer(HfQuantizer):
    """transformers' side of :class:`VGenQuantConfig`: which parameters go to :class:`_Quantize`."""

    requires_calibration = False

    def __init__(self, quantization_config: VGenQuantConfig, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self.prefix: str | None = None
        self.done = 0

    def validate_environment(self, *args, **kwargs):
        if self.pre_quantized:
            raise VGenError("this checkpoint states a vgen quantization already: load it without quantize=")
        device_map = kwargs.get("device_map")
        if device_map not in (None, "cpu"):
            raise VGenError("quantize= loads to the CPU, then the pipeline moves the model to its device: leave "
                            "device_map out")

    def _process_model_before_weight_loading(self, model, **kwargs):
        from vgen.models.hf import family_of
        family = family_of(model)
        decoder = family.decoder(model) if family is not None else None
        names = [n for n, m in model.named_modules() if m is decoder] if decoder is not None else []
        self.prefix = names[0] if names else None  # None: nothing quantized while loading (the caller does it after)

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        layer_name, _, pname = param_name.rpartition(".")
        if pname not in ("weight", "bias") or self.prefix is None:
            return False
        if self.prefix and not layer_name.startswith(self.prefix + "."):
            return False
        try:
            layer = model.get_submodule(layer_name)
        except AttributeError:
            return False
        cfg = self.quantization_config
        return type(layer) in LINEARS and fits(layer, cfg.mode, cfg.group_size)

    def get_quantize_ops(self):
        return _Quantize(self)

    def is_serializable(self, **kwargs) -> bool:
        return False

    @property
    def is_trainable(self) -> bool:
        return False


if METHOD not in AUTO_QUANTIZER_MAPPING:  # once per process (registering twice raises)
    register_quantization_config(METHOD)(VGenQuantConfig)
    register_quantizer(METHOD)(VGenQuantizer)


def quantization_config(mode: str, group_size: int = 32) -> VGenQuantConfig:
    """What ``from_pretrained(..., quantization_config=)`` takes to quantize a registered family's decoder as it
    loads."""
    return VGenQuantConfig(mode, group_size)


def loaded_quantized(model: nn.Module) -> bool:
    """Whether a transformers model was quantized by vgen as it loaded."""
    q = getattr(model, "hf_quantizer", None)
    return isinstance(q, VGenQuantizer)


__all__ = ["METHOD", "VGenQuantConfig", "VGenQuantizer", "loaded_quantized", "quantization_config"]
