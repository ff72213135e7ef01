"""Samplers: one file per method over shared kernels. ``sample(model, labels, sampler=..., seed=...)``."""
from vgen.samplers import ar, ar_latent, cspd, eagle, gsd, lantern, llamagen_loop, mar, nar, pac, scd, sjd, var, zipar  # noqa: F401,E501  (register every sampler)
from vgen.samplers.base import (
                                Options,
                                Sampler,
                                SamplingOptions,
                                TokenOptions,
                                as_cond,
                                check_fits,
                                fitting_samplers,
                                get_sampler,
                                list_samplers,
                                option,
                                option_names,
                                plain_sampler,
                                register_sampler,
                                sample,
                                sampler_class,
                                sampler_classes,
                                unregister_sampler,
)

__all__ = ["Options", "Sampler", "SamplingOptions", "TokenOptions", "as_cond", "get_sampler", "list_samplers", "option",
           "register_sampler", "sample", "sampler_class", "sampler_classes", "option_names", "check_fits",
           "fitting_samplers", "plain_sampler", "unregister_sampler"]
