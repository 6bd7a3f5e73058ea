"""Runs drewlinsley/pathfinder's snakes2 unmodified with LRA's Pathfinder settings."""
import sys, time, types, numpy as np, random
sys.argv = sys.argv  # res n out seed
res, n, out, seed = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
batch = int(sys.argv[5]) if len(sys.argv) > 5 else 0
cl = int(sys.argv[6]) if len(sys.argv) > 6 else 14
import snakes, snakes2
from PIL import Image
# HEAD's NumPy-2 shims (Image.fromarray on floats) cannot save PNGs (mode F) and keep float
# images unscaled (markers ~1/255). The code was written for scipy<=1.1's scipy.misc, whose
# semantics are restored here: toimage = bytescale(min..max -> 0..255, +0.5, uint8) to 'L'.
def _bytescale(data):
    data = np.asarray(data)
    if data.dtype == np.uint8:
        return data
    cmin, cmax = data.min(), data.max()
    cscale = cmax - cmin
    if cscale == 0:
        cscale = 1
    b = (data - cmin) * (255.0 / cscale)
    return (b.clip(0, 255) + 0.5).astype(np.uint8)
def _imresize(arr, size, interp='lanczos'):
    im = Image.fromarray(_bytescale(arr), mode='L')
    r = {'nearest': 0, 'lanczos': 1, 'bilinear': 2, 'bicubic': 3}[interp]
    return np.array(im.resize((size[1], size[0]), resample=r))
def _imsave(path, arr):
    Image.fromarray(_bytescale(arr), mode='L').save(path)
for m in (snakes, snakes2):
    m._imresize = _imresize
    m._imsave = _imsave
a = types.SimpleNamespace(
    contour_path=out, batch_id=batch, n_images=n, window_size=[256, 256], padding=22,
    antialias_scale=4, LABEL=1, seed_distance=27, marker_radius=3, contour_length=15,
    distractor_length=5, num_distractor_snakes=6, snake_contrast_list=[1.],
    use_single_paddles=False, max_target_contour_retrial=4, max_distractor_contour_retrial=4,
    max_paddle_retrial=2, continuity=1.4, paddle_length=5, paddle_thickness=1.5,
    paddle_margin_list=[4], paddle_contrast_list=[1.], pause_display=False,
    save_images=True, save_metadata=True, segmentation_task=False,
    segmentation_task_double_circle=False)
if res == 32:
    a.paddle_margin_list=[1]; a.window_size=[32,32]; a.padding=1; a.paddle_length=2
    a.marker_radius=1.5; a.contour_length=cl; a.paddle_thickness=0.5; a.antialias_scale=2
    a.seed_distance=7; a.continuity=1.0; a.distractor_length=cl//3
    a.num_distractor_snakes=20//a.distractor_length; a.snake_contrast_list=[2]
    a.paddle_contrast_list=[0.75]
elif res == 64:
    a.padding=1; a.paddle_margin_list=[1]; a.seed_distance=12; a.window_size=[64,64]
    a.marker_radius=2.5; a.contour_length=cl; a.paddle_thickness=1; a.antialias_scale=2
    a.continuity=1.8; a.distractor_length=cl//3; a.num_distractor_snakes=22//a.distractor_length
    a.snake_contrast_list=[0.8]
elif res == 128:
    a.padding=1; a.paddle_margin_list=[2,3]; a.seed_distance=20; a.window_size=[128,128]
    a.marker_radius=3; a.contour_length=cl; a.paddle_thickness=1.5; a.antialias_scale=2
    a.continuity=1.8; a.distractor_length=cl//3; a.num_distractor_snakes=35//a.distractor_length
    a.snake_contrast_list=[0.9]
np.random.seed(seed); random.seed(seed)
# Record marker centres (row, col) in drawing order, outside the generator, for the flood-fill
# statistic: two draw_circle calls per saved image.
_markers = []
_draw_circle = snakes2.draw_circle
def _recording_draw_circle(window_size, coordinate, radius, aa_scale):
    _markers.append(list(coordinate))
    return _draw_circle(window_size, coordinate, radius, aa_scale)
snakes2.draw_circle = _recording_draw_circle
# Distractor contours placed per image: successful make_snake calls (snakes2 calls it only
# for distractors when use_single_paddles is False), read off at each image's first marker.
_placed, _per_image = [0], []
_make_snake = snakes.make_snake
def _counting_make_snake(*args, **kw):
    out = _make_snake(*args, **kw)
    _placed[0] += bool(out[2])
    return out
snakes.make_snake = _counting_make_snake
_draw_circle2 = snakes2.draw_circle
def _recording2(window_size, coordinate, radius, aa_scale):
    if len(_markers) % 2 == 0:
        _per_image.append(_placed[0]); _placed[0] = 0
    return _draw_circle2(window_size, coordinate, radius, aa_scale)
snakes2.draw_circle = _recording2
import builtins
_print = builtins.print
builtins.print = lambda *x, **k: None if (x and str(x[0]).startswith('Image#')) else _print(*x, **k)
t = time.time()
snakes2.from_wrapper(a)
_print(f"{n} images in {time.time()-t:.1f}s = {n/(time.time()-t):.2f}/s")
import os, json
with open(os.path.join(out, f"markers_{batch}.json"), "w") as f:
    json.dump(np.array(_markers).astype(int).tolist(), f)
meta = np.load(os.path.join(out, "metadata", f"{batch}.npy"))
m = np.array(_markers).astype(int).tolist()
extra = [{"label": int(meta[i][3]), "markers": m[2 * i:2 * i + 2], "distractors": _per_image[i]}
         for i in range(len(meta))]
os.makedirs(os.path.join(out, "extra"), exist_ok=True)
with open(os.path.join(out, "extra", f"{batch}.json"), "w") as f:
    json.dump(extra, f)
