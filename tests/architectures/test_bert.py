"""The encoder: BERT's published sizes, and numerical parity with Hugging Face's BertForPreTraining."""

import pytest
import torch

from pretextual.architectures.bert import BertModel, BertConfig, PRESETS, preset_config
from pretextual.architectures.common import count_parameters
from pretextual.core.mix import PretrainingModel
from pretextual.objectives.mlm import MLMHead

# Hugging Face BertModel parameter counts (vocab 30522, 512 positions, pooler included).
EXPECTED = {"tiny": 4_385_920, "mini": 11_170_560, "small": 28_763_648, "medium": 41_373_184,
            "base": 109_482_240, "large": 335_141_888}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_parameter_counts(preset):
    with torch.device("meta"):
        model = BertModel(preset_config(preset))
    assert count_parameters(model) == EXPECTED[preset]


def test_tied_mlm_head_adds_only_transform_and_bias():
    config = preset_config("tiny", vocab_size=1000)
    model = PretrainingModel(BertModel(config), {"mlm": MLMHead})
    h = config.hidden_size
    assert count_parameters(model) - count_parameters(model.bert) == h * h + h + 2 * h + 1000
    assert not any("word_embeddings" in k for k in model.heads.state_dict())


def test_parity_with_transformers_bert_for_pretraining():
    transformers = pytest.importorskip("transformers")
    config = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=256, max_position_embeddings=64)
    torch.manual_seed(0)
    ours = PretrainingModel(BertModel(config), {"mlm": MLMHead}).eval()
    hf = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict())).eval()
    state = {k.replace("heads.mlm.", "cls.predictions."): v for k, v in ours.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected
    assert set(missing) <= {"cls.seq_relationship.weight", "cls.seq_relationship.bias",
                            "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}

    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, 500, (3, 20), generator=g)
    attention_mask = torch.ones(3, 20, dtype=torch.long)
    attention_mask[1, 14:] = 0  # padded rows
    attention_mask[2, 7:] = 0
    token_type_ids = torch.zeros(3, 20, dtype=torch.long)
    token_type_ids[:, 10:] = 1
    with torch.no_grad():
        out = ours.bert(input_ids, attention_mask, token_type_ids)
        ref = hf(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                 output_hidden_states=True)
        ref_seq = ref.hidden_states[-1]
        ref_pooled = hf.bert.pooler(ref_seq)
        where = torch.rand(3, 20, generator=g) < 0.3
        where &= attention_mask.bool()
        ours_logits = ours.heads["mlm"](out.last_hidden_state[where])
    valid = attention_mask.bool()
    assert (out.last_hidden_state[valid] - ref_seq[valid]).abs().max() < 1e-5
    assert (out.pooler_output - ref_pooled).abs().max() < 1e-5
    assert (ours_logits - ref.prediction_logits[where]).abs().max() < 1e-5
