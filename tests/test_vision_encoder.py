"""The Qwen3-VL / Qwen3.5 vision tower (qwen3vl_merger mmproj) on the GPU against the float64
numpy reference (tests/vision_reference.py), the mmproj checks, and image preprocessing."""

import io

import numpy as np
import pytest
from PIL import Image
from vision_reference import encode as reference_encode

from vkrt.errors import GGUFError
from vkrt.model.image_input import (
    ImageError,
    decode_image,
    fit_size,
    preprocess,
    resize_padded,
)
from vkrt.model.mmproj_synthetic import MmprojSpec, write_mmproj
from vkrt.model.vision_config import check_against_text
from vkrt.model.vision_encoder import VisionEncoder


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory):
    return write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny.gguf", MmprojSpec())


def _pixels(h, w, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (3, h, w)).astype(np.float32)


@pytest.mark.parametrize("hw", [(64, 128), (96, 96), (32, 64)])
def test_encoder_matches_reference(device, mmproj, hw):
    """Grids above, at and below the position table's side (6): the resize both ways and none."""
    px = _pixels(*hw, seed=hw[0] + hw[1])
    with VisionEncoder(device, mmproj) as enc:
        got = enc.encode(px)
        assert enc.grid(px) == (hw[0] // 32, hw[1] // 32)
    want = reference_encode(mmproj, px)
    assert got.shape == want.shape == (hw[0] * hw[1] // 1024, 64)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    assert np.abs(want).max() > 0.1


def test_encoder_replays_its_recording(device, mmproj):
    """A size's recording is kept and replayed with the next image of that size (the same tokens
    as a fresh encoder's); another size records anew."""
    a, b, wide = _pixels(64, 128, seed=7), _pixels(64, 128, seed=8), _pixels(64, 64, seed=9)
    with VisionEncoder(device, mmproj) as enc:
        first = enc.encode(a)
        run = enc.runs.run
        np.testing.assert_allclose(enc.encode(b), reference_encode(mmproj, b), rtol=2e-3, atol=2e-3)
        assert enc.runs.run is run
        np.testing.assert_array_equal(enc.encode(a), first)
        np.testing.assert_allclose(enc.encode(wide), reference_encode(mmproj, wide), rtol=2e-3, atol=2e-3)
        assert enc.runs.run is not run and run.closed and enc.runs.key == (4, 4)
    np.testing.assert_allclose(first, reference_encode(mmproj, a), rtol=2e-3, atol=2e-3)
    assert enc.runs.run is None


def test_encoder_f16_weights(device, tmp_path):
    path = write_mmproj(tmp_path / "mmproj-f16.gguf", MmprojSpec(weight_type="F16", seed=3))
    px = _pixels(64, 64, seed=1)
    with VisionEncoder(device, path) as enc:
        got = enc.encode(px)
    np.testing.assert_allclose(got, reference_encode(path, px), rtol=5e-3, atol=5e-3)


def test_mmproj_checks(device, mmproj, tmp_path):
    with VisionEncoder(device, mmproj) as enc:
        check_against_text(enc.cfg, 64, "text.gguf")
        with pytest.raises(GGUFError, match=r"mmproj-tiny.gguf: mm.2.bias .* is 64 but the text model text.gguf "
                                            r"has embedding_length 32"):
            check_against_text(enc.cfg, 32, "text.gguf")
    from models import tiny_model
    text = tiny_model("tiny-llama", tmp_path)
    with pytest.raises(GGUFError, match=r"tiny-llama.gguf: general.architecture is 'llama', expected 'clip'"):
        VisionEncoder(device, text)


def test_fit_size():
    """llama.cpp's smart resize: sides rounded (halves up, as std::round), then floored under the
    most pixels or ceiled over the fewest."""
    big = 4096 * 1024
    assert fit_size(128, 64, 32, 8192, big) == (128, 64)             # fits: unchanged
    assert fit_size(100, 100, 32, 1, big) == (96, 96)                # 3.125 sides: rounded down
    assert fit_size(80, 80, 32, 1, big) == (96, 96)                  # 2.5: up, not to even
    assert fit_size(100, 50, 32, 8192, big) == (128, 64)             # rounded, then scaled up to 8192
    assert fit_size(64, 96, 32, 8192, big) == (96, 128)              # tests/vision_cases.py's second image
    assert fit_size(4000, 3000, 32, 8192, 1024 * 1024) == (1152, 864)  # scaled down, floored
    w, h = fit_size(40, 40, 32, 8192, big)                           # scaled up past the minimum
    assert w % 32 == h % 32 == 0 and w * h >= 8192


def test_resize_padded():
    """clip's resize with padding: a 64x96 image in a 96x128 frame is scaled to 86x128 with
    aligned corners (first and last pixels kept), centred on black (5 columns left, 5 right)."""
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (96, 64, 3), dtype=np.uint8)
    out = resize_padded(rgb, 96, 128)
    assert out.shape == (128, 96, 3)
    assert not out[:, :5].any() and not out[:, 91:].any() and out[:, 5].any() and out[:, 90].any()
    np.testing.assert_array_equal(out[0, 5], rgb[0, 0])
    np.testing.assert_array_equal(out[-1, 90], rgb[-1, -1])
    assert resize_padded(rgb, 64, 96) is rgb


def test_preprocess_normalises(mmproj, device):
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    with VisionEncoder(device, mmproj) as enc:
        px = preprocess(decode_image(buf.getvalue(), "image 0"), enc.cfg)
    np.testing.assert_allclose(px, (rgb.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5, atol=1e-6)


def test_bad_images():
    with pytest.raises(ImageError, match=r"image 2: not an image vkrt decodes \(PNG, JPEG"):
        decode_image(b"not an image at all", "image 2")
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, format="PNG")
    with pytest.raises(ImageError, match="image 1: "):
        decode_image(buf.getvalue()[:40], "image 1")


def test_encoder_padded_heads(device, mmproj, monkeypatch):
    """Attention at a padded head size (as where it takes cooperative matrices: heads of 72 at 80)
    gives the tokens of the unpadded heads: the copies in and out, the zero columns."""
    from vkrt.model import vision_ops
    monkeypatch.setattr(vision_ops, "padded_head", lambda device, head, n: head + 16)
    px = _pixels(64, 128, seed=7)
    with VisionEncoder(device, mmproj) as enc:
        got = enc.encode(px)
        assert enc.runs.run.tensors["padded q"].ne[:3] == (enc.cfg.head_dim + 16, enc.cfg.n_head, 32)
        again = enc.encode(_pixels(64, 128, seed=8))
    np.testing.assert_allclose(got, reference_encode(mmproj, px), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(again, reference_encode(mmproj, _pixels(64, 128, seed=8)), rtol=2e-3, atol=2e-3)
