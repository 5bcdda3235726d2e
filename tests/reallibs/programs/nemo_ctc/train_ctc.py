"""CTC speech recognition with NeMo: written for autoalloc's real-library tests in the shape of
NeMo's examples/asr/asr_ctc/speech_to_text_ctc.py (that example is not on the package index and
is not ours to copy). The same library calls run: a @hydra_runner entry point reads
conf/tiny_conv_ctc.yaml, lightning.pytorch.Trainer(**cfg.trainer), exp_manager,
EncDecCTCModel(cfg=cfg.model, trainer=trainer), maybe_init_from_pretrained_checkpoint (nothing
to load here), trainer.fit(model), which builds the optimizer in the model's
configure_optimizers. Speech in, characters out: speech-to-text training.

Usage: python train_ctc.py [hydra overrides]; manifests from make_tiny_data.py --nemo.
"""

import lightning.pytorch as pl
from nemo.collections.asr.models import EncDecCTCModel
from nemo.core.config import hydra_runner
from nemo.utils import logging
from nemo.utils.exp_manager import exp_manager
from nemo.utils.trainer_utils import resolve_trainer_cfg
from omegaconf import OmegaConf


@hydra_runner(config_path="conf", config_name="tiny_conv_ctc")
def main(cfg):
    logging.info(f"Hydra config: {OmegaConf.to_yaml(cfg)}")
    trainer = pl.Trainer(**resolve_trainer_cfg(cfg.trainer))
    exp_manager(trainer, cfg.get("exp_manager", None))
    model = EncDecCTCModel(cfg=cfg.model, trainer=trainer)
    model.maybe_init_from_pretrained_checkpoint(cfg)
    trainer.fit(model)


if __name__ == "__main__":
    main()
