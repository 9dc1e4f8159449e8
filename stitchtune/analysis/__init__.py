"""Analysis of tuning databases: report data, figures and the `stitchtune report` files."""
