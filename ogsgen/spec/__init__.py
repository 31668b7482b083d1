"""The specification layer: functions, numeric formats, kernel variants and catalogs."""
from .catalog import Catalog, default_catalog, load_catalog_file, variant_product
from .formats import (BF16, FP8_E4M3, FP8_E4M3_B128, FP8_E4M3_CHANNEL, FP8_E5M2, FP16, FP32, MXFP4, MXFP4_HOPPER,
                      MXFP4_HOPPER_FP8, MXFP8_E4M3, MXFP8_E5M2, NumericFormat, format_named)
from .functions import FnSpecs, register_activation, register_epilogue, registered, unregister
from .variant import (FEATURES, KernelVariant, canonical_name, companions, split_k_plan, topk_plan,
                      topk_split_k_plan)

__all__ = [
    "BF16", "FP16", "FP32", "FP8_E4M3", "FP8_E5M2", "FP8_E4M3_B128", "FP8_E4M3_CHANNEL", "MXFP4", "MXFP4_HOPPER",
    "MXFP4_HOPPER_FP8", "MXFP8_E4M3", "MXFP8_E5M2",
    "NumericFormat",
    "format_named", "FnSpecs", "register_activation", "register_epilogue", "registered", "unregister",
    "FEATURES", "KernelVariant", "canonical_name", "companions", "split_k_plan", "topk_plan",
    "topk_split_k_plan", "Catalog", "default_catalog", "load_catalog_file",
    "variant_product",
]
