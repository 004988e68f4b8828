"""nbgrader configuration for this course. Run nbgrader from this folder (`cd autograder`):

    nbgrader generate_assignment 03_paged_kv --force   # solutions/03_paged_kv -> notebooks/03_paged_kv
    nbgrader autograde 03_paged_kv --force              # course_dir/submitted/<student>/03_paged_kv
    nbgrader generate_feedback 03_paged_kv --force      # -> course_dir/feedback
    nbgrader export                                     # -> grades.csv

The course directory is the repository: sources in `solutions/`, the released student notebooks
in `notebooks/` (generated, never edited by hand). Everything nbgrader writes while grading
(submissions, autograded copies, feedback, the gradebook) goes to `course_dir/` (git-ignored).
Set AUTOGRADER_COURSE_ROOT to use another course directory (the demo does).
"""
import os

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

_here = os.path.dirname(os.path.abspath(__file__))
_root = os.environ.get("AUTOGRADER_COURSE_ROOT", os.path.dirname(_here))
_state = os.environ.get("AUTOGRADER_STATE_DIR", "course_dir")

c.CourseDirectory.root = _root
c.CourseDirectory.course_id = "llm-serving-course"
c.CourseDirectory.source_directory = os.environ.get("AUTOGRADER_SOURCE_DIR", "solutions")
c.CourseDirectory.release_directory = os.environ.get("AUTOGRADER_RELEASE_DIR", "notebooks")
c.CourseDirectory.submitted_directory = os.path.join(_state, "submitted")
c.CourseDirectory.autograded_directory = os.path.join(_state, "autograded")
c.CourseDirectory.feedback_directory = os.path.join(_state, "feedback")
c.CourseDirectory.solution_directory = os.path.join(_state, "solution")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(_root, _state, "gradebook.db")
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*"]

# Solutions become stubs that fail: every graded test cell fails on the released notebook.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
c.ClearSolutions.enforce_metadata = True
c.GenerateAssignment.create_assignment = True

# Execution: the kernel is named explicitly (never whatever a notebook's metadata says), and
# timeouts are explicit. The setup cell of the guard imports torch: give cells room.
c.ExecutePreprocessor.kernel_name = "python3"
c.ExecutePreprocessor.timeout = 180
c.Execute.kernel_name = "python3"
c.Execute.timeout = int(os.environ.get("AUTOGRADER_CELL_TIMEOUT", "180"))
c.Execute.interrupt_on_timeout = True
c.Execute.startup_timeout = 180
c.Execute.extra_arguments = ["--IPKernelApp.log_level=CRITICAL"]  # no kernel chatter on stderr

# The integrity guard around nbgrader's Execute (see autograder/nbgrader_plugin.py).
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties, CheckCellMetadata, Execute, IgnorePattern, LimitOutput, SaveAutoGrades)

from autograder.nbgrader_plugin import InjectGuard, VerifyGuard  # noqa: E402

c.Autograde.autograde_preprocessors = [InjectGuard, Execute, VerifyGuard, IgnorePattern, ClearMetadataPreprocessor,
                                       LimitOutput, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
