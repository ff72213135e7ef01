"""Every zoo recipe (importing this registers them all with ``vgen.train.common.recipe``)."""
from vgen.train.car_distill import CarDistillConfig, train_car_distill
from vgen.train.continuous import ContinuousTrainConfig, train_continuous
from vgen.train.drafter import DrafterTrainConfig, train_drafter
from vgen.train.emu3 import Emu3TrainConfig, train_emu3
from vgen.train.gpt import GPTTrainConfig, train_gpt
from vgen.train.kl import KLTrainConfig, train_kl
from vgen.train.msvq import MSVQTrainConfig, train_msvq
from vgen.train.nar import NARTrainConfig, train_nar
from vgen.train.photo import PhotoTrainConfig, train_photo
from vgen.train.t2i import T2ITrainConfig, train_t2i
from vgen.train.var import VARTrainConfig, train_var
from vgen.train.video import VideoGPTTrainConfig, VideoNARTrainConfig, train_video_gpt, train_video_nar
from vgen.train.video_classifier import VideoClassifierTrainConfig, train_video_classifier
from vgen.train.vq import VQTrainConfig, train_vq

__all__ = ["GPTTrainConfig", "MSVQTrainConfig", "NARTrainConfig", "PhotoTrainConfig", "VARTrainConfig", "VQTrainConfig",
           "VideoGPTTrainConfig", "VideoNARTrainConfig", "train_video_gpt", "train_video_nar", "train_gpt", "train_msvq", "train_nar", "train_photo", "train_var", "train_vq"]
__all__ += ["VideoClassifierTrainConfig", "train_video_classifier"]
__all__ += ["KLTrainConfig", "train_kl"]
__all__ += ["ContinuousTrainConfig", "train_continuous"]
__all__ += ["DrafterTrainConfig", "train_drafter"]
__all__ += ["CarDistillConfig", "train_car_distill"]
__all__ += ["T2ITrainConfig", "train_t2i"]
__all__ += ["Emu3TrainConfig", "train_emu3"]
