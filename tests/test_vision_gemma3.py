"""Gemma 3's vision tower (gemma3 mmproj, SiglipEncoder) on the GPU against the float64 numpy
reference (tests/vision_reference_gemma3.py), its preprocessing against the reference's, and the
checks of a gemma3 projector file and of its text model."""

import gguf
import numpy as np
import pytest
from models import tiny_model
from vision_cases import GEMMA3_MMPROJ, image_png, image_rgb
from vision_reference_gemma3 import encode as reference_encode
from vision_reference_gemma3 import preprocess as reference_preprocess

from vkrt.errors import GGUFError
from vkrt.model import vision_run
from vkrt.model.gguf_file import GGUFFile
from vkrt.model.image_input import decode_image, preprocess
from vkrt.model.loader import Model
from vkrt.model.mmproj_synthetic import MmprojSpec, write_mmproj
from vkrt.model.vision import Vision
from vkrt.model.vision_config import GEMMA3, check_against_text, vision_config
from vkrt.model.vision_encoder import VisionEncoder
from vkrt.model.vision_memory import activation_bytes, encoder_vram
from vkrt.model.vision_siglip import SiglipEncoder
from vkrt.model.vision_towers import open_encoder
from vkrt.model.vision_weights import transposed_bytes, transposed_matrix

SPEC = MmprojSpec(projector=GEMMA3, proj_dim=64, patch_size=8, n_merge=4, n_pos_side=16, seed=5)


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory):
    return write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-gemma3.gguf", SPEC)


def _pixels(size, seed=0):
    return np.random.default_rng(seed).uniform(-1.5, 1.5, (3, size, size)).astype(np.float32)


@pytest.mark.parametrize("spec, tol", [
    (SPEC, 2e-4),                                                                     # pooled 4 x 4 (the default)
    (MmprojSpec(projector=GEMMA3, patch_size=8, n_merge=2, n_pos_side=8, n_head=4, seed=6), 2e-4),   # scale_factor 2
    (MmprojSpec(projector=GEMMA3, patch_size=8, n_merge=4, n_pos_side=8, weight_type="F16", seed=7), 5e-3)])
def test_encoder_matches_reference(device, tmp_path, spec, tol):
    path = write_mmproj(tmp_path / "mmproj.gguf", spec)
    size = spec.patch_size * spec.n_pos_side
    px = _pixels(size, seed=spec.seed)
    with SiglipEncoder(device, path) as enc:
        got = enc.encode(px)
        side = spec.n_pos_side // spec.n_merge
        assert enc.grid(px) == (side, side)
    want = reference_encode(path, px)
    assert got.shape == want.shape == (side * side, spec.proj_dim)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert np.abs(want).max() > 0.5


def test_replayed_recording(device, mmproj):
    """The one size's recording is replayed for the next image: the same tokens as a fresh encoder's."""
    a, b = _pixels(128, seed=9), _pixels(128, seed=10)
    with SiglipEncoder(device, mmproj) as enc:
        first = enc.encode(a)
        run = enc.runs.run
        np.testing.assert_allclose(enc.encode(b), reference_encode(mmproj, b), rtol=2e-4, atol=2e-4)
        np.testing.assert_array_equal(enc.encode(a), first)
        assert enc.runs.run is run
    np.testing.assert_allclose(first, reference_encode(mmproj, a), rtol=2e-4, atol=2e-4)


def _swap(name: str) -> str:
    return name.replace("ffn_up", "ffn_@").replace("ffn_down", "ffn_up").replace("ffn_@", "ffn_down")


def test_swapped_ffn_names(device, mmproj, tmp_path, monkeypatch):
    """ffn_up / ffn_down named the other way round (older conversions: ffn_down.weight then takes
    the tower's width in) are swapped back, as clip.cpp does: the same tokens."""
    add = gguf.GGUFWriter.add_tensor
    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", lambda self, name, *a, **k: add(self, _swap(name), *a, **k))
    swapped = write_mmproj(tmp_path / "mmproj-swapped.gguf", SPEC)
    monkeypatch.undo()
    with GGUFFile(swapped, progress=False) as f:
        assert f.tensors["v.blk.0.ffn_down.weight"].ne[0] == SPEC.n_embd
    px = _pixels(128, seed=4)
    with SiglipEncoder(device, mmproj) as a, SiglipEncoder(device, swapped) as b:
        np.testing.assert_array_equal(b.encode(px), a.encode(px))


def test_config_and_memory(device, mmproj, monkeypatch):
    """The file's settings, and the VRAM estimate: the weights as uploaded (the position table
    stays on the host) and the buffers encode() takes."""
    with GGUFFile(mmproj, progress=False) as f:
        vc = vision_config(mmproj, f.metadata, f.tensors)
        assert "clip.vision.projector.scale_factor" not in f.metadata   # the converter's default, 4
    assert (vc.projector, vc.n_merge, vc.image_size, vc.proj_dim, vc.n_pos_side) == (GEMMA3, 4, 128, 64, 16)
    assert vc.fixed_size and vc.bidirectional and vc.min_pixels == vc.max_pixels == 128 * 128
    taken = []
    empty = vision_run.Tensor.empty

    class Counting:
        @staticmethod
        def empty(*a, **k):
            t = empty(*a, **k)
            taken.append(t.nbytes)
            return t
    with SiglipEncoder(device, mmproj) as enc:
        weights = sum(t.nbytes for t in enc.w.values())
        monkeypatch.setattr(vision_run, "Tensor", Counting)
        enc.encode(_pixels(128))
    assert sum(taken) == activation_bytes(vc, 256) > 0
    assert encoder_vram(mmproj) == weights + activation_bytes(vc, 256)


def test_quantised_projection_transposed(tmp_path):
    """A quantised mm.input_projection.weight is dequantised (gguf.quants) and transposed on the
    host, F16 transposed as it is; encoder_vram counts them so."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((32, 64)).astype(np.float32)   # numpy [tower width, text width]
    path = str(tmp_path / "q.gguf")
    writer = gguf.GGUFWriter(path, "clip")
    q8 = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("f16", w.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with GGUFFile(path, progress=False) as f:
        q, h = transposed_matrix(f, "q8"), transposed_matrix(f, "f16")
        assert transposed_bytes(f.tensors["q8"]) == 4 * 32 * 64 and transposed_bytes(f.tensors["f16"]) == 2 * 32 * 64
    assert q.dtype == np.float32 and h.dtype == np.float16 and q.shape == h.shape == (64, 32)
    np.testing.assert_array_equal(q, gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0).T)
    np.testing.assert_array_equal(h, w.astype(np.float16).T)
    assert np.abs(q - w.T).max() < 0.05


@pytest.mark.parametrize("spec, message", [
    (MmprojSpec(projector=GEMMA3, patch_size=8, n_merge=3, n_pos_side=16), r"image_size 128 is not a multiple of "
                                                                           r"patch_size 8 x the pooling 3"),
])
def test_bad_projectors(device, tmp_path, spec, message):
    path = write_mmproj(tmp_path / "bad.gguf", spec)
    with pytest.raises(GGUFError, match=message):
        SiglipEncoder(device, path)


def test_tower_by_projector(device, mmproj, tmp_path):
    """open_encoder picks the file's tower; each tower refuses the other's file."""
    qwen = write_mmproj(tmp_path / "mmproj-qwen.gguf", MmprojSpec())
    with open_encoder(device, mmproj) as a, open_encoder(device, qwen) as b:
        assert isinstance(a, SiglipEncoder) and isinstance(b, VisionEncoder)
    with pytest.raises(GGUFError, match="a gemma3 projector is not a Qwen-VL tower"):
        VisionEncoder(device, mmproj)
    with pytest.raises(GGUFError, match="a qwen3vl_merger projector is not Gemma 3's SigLIP tower"):
        SiglipEncoder(device, qwen)


def test_checks_against_text(device, mmproj, tmp_path):
    """Width, then the kind of text model: a gemma3 projector takes a gemma3 text model, a Qwen-VL
    projector one with M-RoPE (tiny-gemma3 and tiny-qwen35 are both 64 wide)."""
    with GGUFFile(mmproj, progress=False) as f:
        vc = vision_config(mmproj, f.metadata, f.tensors)
    check_against_text(vc, 64, "g.gguf", "gemma3", False)
    with pytest.raises(GGUFError, match=r"mm.input_projection.weight \(the projection width\) is 64 but the text "
                                        r"model g.gguf has embedding_length 32"):
        check_against_text(vc, 32, "g.gguf", "gemma3", False)
    text = tiny_model("tiny-qwen35", tmp_path)
    with Model(device, text, progress=False) as model:
        with pytest.raises(GGUFError, match=r"a gemma3 vision projector goes with a Gemma 3 text model, but "
                                            r".*tiny-qwen35.gguf is 'qwen35'"):
            Vision(device, mmproj, model.cfg, text)
    gemma = tiny_model("tiny-gemma3", tmp_path)
    qwen = write_mmproj(tmp_path / "mmproj-qwen.gguf", MmprojSpec())
    with Model(device, gemma, progress=False) as model:
        with pytest.raises(GGUFError, match=r"a qwen3vl_merger vision projector goes with a Qwen-VL text model "
                                            r"\(M-RoPE\), but .*tiny-gemma3.gguf \(gemma3\) has none"):
            Vision(device, qwen, model.cfg, gemma)
        with Vision(device, mmproj, model.cfg, gemma) as vision:
            assert vision.bidirectional and not vision.mrope
            assert vision.frame == ("<start_of_image>", "<end_of_image>")


@pytest.mark.parametrize("hwseed", [(128, 128, 3), (72, 160, 4), (300, 190, 5), (33, 2, 6)])
def test_preprocess_matches_reference(hwseed):
    """The fixed-size preprocessing: any image scaled (aspect kept) into the 128 x 128 square,
    centred on black, normalised per channel; as the reference's loops compute it."""
    vc = _config(GEMMA3_MMPROJ)
    rgb = image_rgb(*hwseed)
    got = preprocess(decode_image(image_png(*hwseed), "image"), vc)
    want = reference_preprocess(rgb, 128, GEMMA3_MMPROJ.mean, GEMMA3_MMPROJ.std)
    assert got.shape == (3, 128, 128)
    np.testing.assert_allclose(got, want, atol=1e-6)
    black = (0.0 - np.asarray(GEMMA3_MMPROJ.mean, np.float32)) / np.asarray(GEMMA3_MMPROJ.std, np.float32)
    h, w = hwseed[:2]
    if w > h:   # padded above and below
        np.testing.assert_allclose(got[:, 0, :], np.repeat(black[:, None], 128, axis=1), atol=1e-6)
    elif h > w:
        np.testing.assert_allclose(got[:, :, 0], np.repeat(black[:, None], 128, axis=1), atol=1e-6)
    else:   # the projector's size: read as it is
        mean, std = (np.asarray(v, np.float32)[:, None, None] for v in (GEMMA3_MMPROJ.mean, GEMMA3_MMPROJ.std))
        np.testing.assert_allclose(got, (rgb.transpose(2, 0, 1) / np.float32(255) - mean) / std, atol=1e-6)


def _config(spec):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = write_mmproj(f"{d}/m.gguf", spec)
        with GGUFFile(path, progress=False) as f:
            return vision_config(path, f.metadata, f.tensors)
