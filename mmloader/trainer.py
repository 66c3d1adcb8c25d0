"""mmloader.torch.TrainerCallback: exact resume of an :class:`mmloader.torch.Loader` in a
Hugging Face ``transformers.Trainer`` (imported on first use of
``mmloader.torch.TrainerCallback``; needs transformers and accelerate)::

    loader = mmloader.torch.Loader("train.jsonl", model_dir=ckpt, micro_batch_size=4)
    trainer = Trainer(model=model, args=args, callbacks=[mmloader.torch.TrainerCallback(loader)])
    trainer.get_train_dataloader = lambda: loader
    trainer.train(resume_from_checkpoint=True)   # or a checkpoint folder

What it does, and why each part is needed:

1. Every checkpoint's ``trainer_state.json`` holds the loader's state of each data-parallel
   rank at that step (``stateful_callbacks``: the Trainer's own place for callback state,
   so it travels with the checkpoint folder wherever it is copied).  With ``dp_size > 1``
   the states are gathered to rank 0 when the Trainer decides to save after a step or an
   epoch (``save_strategy`` "steps" / "epoch"; "best" decides later and is refused).
2. On ``resume_from_checkpoint`` the state of this rank at the checkpoint's step is
   restored before the first batch; a checkpoint without one (or from another step) is a
   StateError, never a silent restart of the data.
3. The Trainer then skips the batches of the resumed epoch with accelerate's
   ``skip_first_batches``; ``Loader.dataset`` shows them as ``None`` placeholders, so
   nothing is read twice, and ``Loader.set_epoch`` of the epoch the loader stands in does
   not rewind it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from transformers import TrainerCallback as _HFCallback
from transformers.trainer_callback import ExportableState

from ._core import ConfigError, StateError
from ._dpstate import restore_state_global, save_state_global

#: the key of the state in trainer_state.json's stateful_callbacks (the class name)
NAME = "MMLoaderCallback"


class MMLoaderCallback(_HFCallback, ExportableState):
    """Saves the loader's state in each Trainer checkpoint and restores it on resume (see
    the module docstring).  ``loader``: the :class:`mmloader.torch.Loader` the Trainer's
    ``get_train_dataloader`` returns."""

    def __init__(self, loader: Any = None) -> None:
        if loader is None:
            raise ConfigError(
                "mmloader.torch.TrainerCallback(loader): the loader is required (and "
                "TrainingArguments(restore_callback_states_from_checkpoint=True), which "
                "rebuilds callbacks without it, is not supported: the callback restores "
                "its loader by itself)"
            )
        self.loader = loader
        self._states: Optional[List[Dict[str, Any]]] = None
        self._step = -1

    # ---- saving ----------------------------------------------------------------------
    def _capture(self, state: Any, control: Any) -> None:
        """The states of every rank at this step, before the Trainer writes the checkpoint
        (all ranks call this at the same step: the gather is a collective)."""
        if control.should_save:
            self._states = save_state_global(self.loader, 0, getattr(self.loader, "dp_group", None))
            self._step = state.global_step

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._capture(state, control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._capture(state, control)

    def state(self) -> Dict[str, Any]:
        # called where trainer_state.json is written (rank 0), at every save and when the
        # Trainer starts; a single rank needs no gather
        if self.loader.dp_size == 1:
            states: Optional[List[Dict[str, Any]]] = [self.loader.state_dict()]
            step: Optional[int] = None  # now, whatever the step
        else:
            states, step = self._states, self._step
        return {"args": {}, "attributes": {"loader_states": states, "loader_step": step}}

    # ---- restoring -------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if getattr(args, "restore_callback_states_from_checkpoint", False):
            raise ConfigError(
                "mmloader.torch.TrainerCallback does not work with "
                "restore_callback_states_from_checkpoint=True (the Trainer would rebuild "
                "it without its loader); the callback restores the loader by itself"
            )

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == 0:
            return
        saved = (state.stateful_callbacks or {}).get(NAME)
        if isinstance(saved, list):  # one loader per callback; the first is ours
            saved = saved[0] if saved else None
        attrs = (saved or {}).get("attributes") or {}
        states, step = attrs.get("loader_states"), attrs.get("loader_step")
        if not states:
            raise StateError(
                f"resuming at step {state.global_step}: the checkpoint holds no mmloader "
                "state (it was saved without mmloader.torch.TrainerCallback, or with "
                'save_strategy="best" and dp_size > 1); the data cannot resume exactly'
            )
        if step is not None and step != state.global_step:
            raise StateError(
                f"the checkpoint's mmloader state is of step {step}, the checkpoint of step "
                f"{state.global_step} (a save the callback did not see coming: "
                'save_strategy="best" with dp_size > 1 is not supported)'
            )
        restore_state_global(self.loader, states, group=getattr(self.loader, "dp_group", None))


MMLoaderCallback.__name__ = NAME
