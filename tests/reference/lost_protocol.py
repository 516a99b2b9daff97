"""Oracle: LOST's evaluation protocol around the arithmetic of ``lost_object_discovery.py``, transcribed.

Sources:

* ``valeoai/LOST`` at commit c0ff67ba3baf807107447cc54d5f997cb358a383: ``datasets.py`` (``transform``:
  ToTensor + Normalize with ImageNet's mean/std; ``extract_gt_VOC``: ``int`` coordinates, ``xmin - 1``,
  ``ymin - 1``; ``extract_gt_COCO``: ``iscrowd == 1`` skipped, ``[x, y, x + w, y + h]`` each ``int(round())``;
  ``bbox_iou``), ``main_lost.py`` (zero padding to ``ceil(size / patch) * patch`` after normalising, one image
  per forward, CLS row dropped from the keys, ``torch.any(ious >= 0.5)``), ``object_discovery.py``
  (``detect_box``: cells times the patch size, ``xmax`` / ``ymax`` clipped to the unpadded width / height).
* ``facebookresearch/dino`` at commit 04c0ad957c9fd04cced6d703668bc049586d1d21, ``vision_transformer.py``
  (``interpolate_pos_encoding``, ``prepare_tokens``), the model LOST loads.

Written with torch / torchvision as the reference is; only what the tests compare is transcribed.
"""
import math

import torch
import torch.nn as nn
from torchvision import transforms as pth_transforms

transform = pth_transforms.Compose([
    pth_transforms.ToTensor(),
    pth_transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
])


def padded_input(pil_image, patch_size):
    """main_lost.py: the transformed image zero-padded to a multiple of the patch size -> ([3, Hp, Wp], init size)."""
    img = transform(pil_image.convert("RGB"))
    init_image_size = img.shape
    size_im = (img.shape[0], int(math.ceil(img.shape[1] / patch_size) * patch_size),
               int(math.ceil(img.shape[2] / patch_size) * patch_size))
    paded = torch.zeros(size_im)
    paded[:, : img.shape[1], : img.shape[2]] = img
    return paded, init_image_size


def interpolate_pos_encoding(pos_embed, patch_size, x_tokens, w, h):
    """DINO's VisionTransformer.interpolate_pos_encoding (``w``, ``h``: the input's dims 2 and 3)."""
    npatch = x_tokens.shape[1] - 1
    N = pos_embed.shape[1] - 1
    if npatch == N and w == h:
        return pos_embed
    class_pos_embed = pos_embed[:, 0]
    patch_pos_embed = pos_embed[:, 1:]
    dim = x_tokens.shape[-1]
    w0 = w // patch_size
    h0 = h // patch_size
    w0, h0 = w0 + 0.1, h0 + 0.1
    patch_pos_embed = nn.functional.interpolate(
        patch_pos_embed.reshape(1, int(math.sqrt(N)), int(math.sqrt(N)), dim).permute(0, 3, 1, 2),
        scale_factor=(w0 / math.sqrt(N), h0 / math.sqrt(N)),
        mode="bicubic",
    )
    assert int(w0) == patch_pos_embed.shape[-2] and int(h0) == patch_pos_embed.shape[-1]
    patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
    return torch.cat((class_pos_embed.unsqueeze(0), patch_pos_embed), dim=1)


@torch.no_grad()
def last_keys(timm_model, img):
    """DINO's prepare_tokens on a timm ViT's weights, its blocks, and LOST's qkv hook on the last block:
    keys [1, P, h * dh] (heads concatenated, CLS row dropped) of ``img`` [1, 3, H, W]."""
    B, nc, w, h = img.shape
    x = timm_model.patch_embed.proj(img).flatten(2).transpose(1, 2)
    x = torch.cat((timm_model.cls_token.expand(B, -1, -1), x), dim=1)
    x = x + interpolate_pos_encoding(timm_model.pos_embed, timm_model.patch_embed.patch_size[0], x, w, h)
    feat_out = {}
    blocks = timm_model.blocks
    handle = blocks[-1].attn.qkv.register_forward_hook(lambda m, i, o: feat_out.__setitem__("qkv", o))
    for blk in blocks:
        x = blk(x)
    handle.remove()
    nb_tokens, nh = x.shape[1], blocks[-1].attn.num_heads
    qkv = feat_out["qkv"].reshape(B, nb_tokens, 3, nh, -1 // nh).permute(2, 0, 3, 1, 4)
    k = qkv[1].transpose(1, 2).reshape(B, nb_tokens, -1)
    return k[:, 1:, :]


def detect_box_pixels(box_cells, patch_size, init_image_size):
    """detect_box's rescaling: [xmin, ymin, xmax, ymax] cells -> pixels, xmax/ymax clipped (init: [C, H, W])."""
    xmin, ymin, xmax, ymax = box_cells
    pred = [patch_size * xmin, patch_size * ymin, patch_size * xmax, patch_size * ymax]
    pred[2] = min(pred[2], init_image_size[2])
    pred[3] = min(pred[3], init_image_size[1])
    return pred


def extract_gt_voc(objects):
    """objects: [{'bndbox': {'xmin': '1', ...}}, ...] (strings, as torchvision's VOCDetection gives them)."""
    gt = []
    for o in objects:
        obj = o["bndbox"]
        b = [int(obj["xmin"]), int(obj["ymin"]), int(obj["xmax"]), int(obj["ymax"])]
        b[0] -= 1
        b[1] -= 1
        gt.append(b)
    return gt


def extract_gt_coco(objects):
    gt = []
    for o in objects:
        if o["iscrowd"] == 1:
            continue
        bbx = o["bbox"]
        gt.append([int(round(v)) for v in [bbx[0], bbx[1], bbx[0] + bbx[2], bbx[1] + bbx[3]]])
    return gt


def bbox_iou(box1, box2, eps=1e-7):
    """datasets.py bbox_iou (x1y1x2y2, plain IoU): box1 [4], box2 [n, 4] tensors -> [n]."""
    box2 = box2.T
    b1_x1, b1_y1, b1_x2, b1_y2 = box1[0], box1[1], box1[2], box1[3]
    b2_x1, b2_y1, b2_x2, b2_y2 = box2[0], box2[1], box2[2], box2[3]
    inter = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(0) * (
        torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)).clamp(0)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    union = w1 * h1 + w2 * h2 - inter + eps
    return inter / union


def corloc_hit(pred, gt):
    """main_lost.py: torch.any(bbox_iou(pred, gt) >= 0.5) on int64 arrays, as the reference builds them."""
    ious = bbox_iou(torch.tensor(pred, dtype=torch.int64), torch.tensor(gt, dtype=torch.int64))
    return bool(torch.any(ious >= 0.5))
