mod text;
