"""Tiny datasets in mmdet's and mmseg's own formats, generated (no download).

- ``data/coco/``: COCO-format ``annotations/instances_{train,val}2017.json``
  and JPEG images in ``train2017/`` / ``val2017/``: landscape and portrait
  images of different sizes, 1-3 boxes each (a filled rectangle of the
  class's colour on noise), 3 categories.
- ``data/cityscapes/``: Cityscapes' layout (``leftImg8bit/{train,val}/
  <city>/<name>_leftImg8bit.png`` and ``gtFine/.../
  <name>_gtFine_labelTrainIds.png``, 19 train ids and 255), what
  ``CityscapesDataset`` reads.
- ``data/tinycls/``: mmpretrain's ``CustomDataset`` layout
  (``{train,val}/<class>/<name>.png``): the 3 categories' shapes on noise,
  64x64.

Example:
    .. code-block:: bash

        python tools/downstream/make_data.py WORK_DIR   # WORK_DIR/data/...
"""
import argparse
import json
import os
import os.path as osp

import cv2
import numpy as np

CATEGORIES = ('square', 'bar', 'blob')
COLOURS = ((230, 40, 40), (40, 230, 40), (40, 40, 230))  # BGR
# (width, height): landscape and portrait, no two alike
COCO_SIZES = {
    'train': [(320, 240), (288, 224), (256, 192), (240, 320), (352, 256),
              (224, 288), (300, 200), (336, 240)],
    'val': [(320, 224), (224, 320), (288, 208), (256, 256)],
}
CITYSCAPES = {'train': 8, 'val': 4}
CITY_SHAPE = (128, 256)  # (height, width): Cityscapes' 1:2


def _noise(rng, height, width):
    return rng.integers(0, 90, (height, width, 3), dtype=np.uint8)


def make_coco(root: str, seed: int = 0) -> dict:
    """Write ``root/data/coco``; return the number of images per split."""
    rng = np.random.default_rng(seed)
    data = osp.join(root, 'data', 'coco')
    os.makedirs(osp.join(data, 'annotations'), exist_ok=True)
    counts = {}
    ann_id = 1
    for split, sizes in COCO_SIZES.items():
        folder = osp.join(data, f'{split}2017')
        os.makedirs(folder, exist_ok=True)
        images, annotations = [], []
        for index, (width, height) in enumerate(sizes):
            image_id = 1 + index + (100 if split == 'val' else 0)
            img = _noise(rng, height, width)
            for _ in range(int(rng.integers(1, 4))):
                cat = int(rng.integers(0, len(CATEGORIES)))
                w = int(rng.integers(width // 5, width // 2))
                h = int(rng.integers(height // 5, height // 2))
                x = int(rng.integers(0, width - w))
                y = int(rng.integers(0, height - h))
                img[y:y + h, x:x + w] = COLOURS[cat]
                annotations.append(
                    dict(
                        id=ann_id,
                        image_id=image_id,
                        category_id=cat + 1,
                        bbox=[x, y, w, h],
                        area=w * h,
                        iscrowd=0,
                        segmentation=[[x, y, x + w, y, x + w, y + h, x,
                                       y + h]]))
                ann_id += 1
            name = f'{image_id:012d}.jpg'
            cv2.imwrite(osp.join(folder, name), img)
            images.append(
                dict(id=image_id, file_name=name, width=width, height=height))
        with open(
                osp.join(data, 'annotations', f'instances_{split}2017.json'),
                'w') as f:
            json.dump(
                dict(
                    images=images,
                    annotations=annotations,
                    categories=[
                        dict(id=i + 1, name=name, supercategory='shape')
                        for i, name in enumerate(CATEGORIES)
                    ]), f)
        counts[split] = len(images)
    return counts


def make_cityscapes(root: str, seed: int = 1) -> dict:
    """Write ``root/data/cityscapes``; return the images per split."""
    rng = np.random.default_rng(seed)
    data = osp.join(root, 'data', 'cityscapes')
    height, width = CITY_SHAPE
    for split, count in CITYSCAPES.items():
        img_dir = osp.join(data, 'leftImg8bit', split, 'tinytown')
        seg_dir = osp.join(data, 'gtFine', split, 'tinytown')
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(seg_dir, exist_ok=True)
        for index in range(count):
            img = _noise(rng, height, width)
            seg = np.full((height, width), 255, np.uint8)  # ignore
            # a road, a sky and a few objects: several classes per crop
            seg[height // 2:] = 0
            seg[:height // 4] = 10
            img[height // 2:] = (70, 70, 70)
            img[:height // 4] = (200, 150, 90)
            for _ in range(4):
                label = int(rng.integers(1, 19))
                h = int(rng.integers(height // 8, height // 3))
                w = int(rng.integers(width // 16, width // 4))
                y = int(rng.integers(0, height - h))
                x = int(rng.integers(0, width - w))
                seg[y:y + h, x:x + w] = label
                img[y:y + h,
                    x:x + w] = (13 * label, 255 - 11 * label, 7 * label)
            name = f'tinytown_{index:06d}_000019'
            cv2.imwrite(osp.join(img_dir, f'{name}_leftImg8bit.png'), img)
            cv2.imwrite(
                osp.join(seg_dir, f'{name}_gtFine_labelTrainIds.png'), seg)
    return dict(CITYSCAPES)


CLS_IMAGES = {'train': 4, 'val': 2}  # per class
CLS_SIZE = 64


def make_classification(root: str, seed: int = 2) -> dict:
    """Write ``root/data/tinycls``; return the number of images per split
    (each class a folder: ``CustomDataset`` takes the classes from them)."""
    rng = np.random.default_rng(seed)
    counts = {}
    for split, per_class in CLS_IMAGES.items():
        for cat, (name, colour) in enumerate(zip(CATEGORIES, COLOURS)):
            folder = osp.join(root, 'data', 'tinycls', split, name)
            os.makedirs(folder, exist_ok=True)
            for index in range(per_class):
                img = _noise(rng, CLS_SIZE, CLS_SIZE)
                w = int(rng.integers(16, 40)) if cat != 1 else 48
                h = int(rng.integers(16, 40)) if cat != 1 else 12
                x = int(rng.integers(0, CLS_SIZE - w))
                y = int(rng.integers(0, CLS_SIZE - h))
                img[y:y + h, x:x + w] = colour
                cv2.imwrite(osp.join(folder, f'{index:03d}.png'), img)
        counts[split] = per_class * len(CATEGORIES)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('root', help='the data go to ROOT/data/')
    args = parser.parse_args()
    print('coco', make_coco(args.root))
    print('cityscapes', make_cityscapes(args.root))
    print('tinycls', make_classification(args.root))


if __name__ == '__main__':
    main()
