"""Where the course is published: the one setting behind every "Open in Colab" badge and install cell.

Written by `python scripts/publish.py --repo OWNER/NAME [--version V]`, which then rewrites the
badges and install cells of solutions/ and regenerates notebooks/ from it; do not edit the
notebooks' badges by hand. Until COURSE_REPO is set, the notebooks say the course is not published
yet and how to open a notebook on Colab by uploading it (with the wheel built from this repository).
"""
# "OWNER/NAME" of the GitHub repository holding the course, or None before it is published.
COURSE_REPO = None
# The package version the notebooks install on Colab: the GitHub release "v<version>" must carry
# the wheel `llm_serving_course-<version>-py3-none-any.whl` (scripts/publish.py prints the steps).
COURSE_VERSION = "0.1.0"
